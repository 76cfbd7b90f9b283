//! The integration tests of tailguard-auth.
mod basic;
