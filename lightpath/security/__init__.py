"""Identities, certificates and client credentials (issue: security).

* `identity`: who a caller is — a `Principal` (kind + name) and its URI in a
  certificate's subject alternative names.
* `pki`: a local certificate authority made with the `cryptography` package
  (the local stack's, the tests'); your own CA works the same way.
* `credentials`: what a client presents — CA, certificate and key, and/or a
  bearer token — found from settings or the local stack's state directory.
"""
