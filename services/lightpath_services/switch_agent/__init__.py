"""Reference agent of the optical-switch southbound (issue 20): simulated switches."""
