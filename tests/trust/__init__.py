"""The trust room: tokens, credentials, revocation, egress, tenants."""
