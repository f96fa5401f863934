"""ocs_manager: one per superpod; programs the optical circuit switches and 1xK switches (OCS-1 … OCS-9)."""
