//! The integration tests of tailguard-auth.
