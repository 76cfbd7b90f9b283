//! The lab: an open-loop, constant-rate load generator, a latency recorder, a scraper and the
//! scenarios that rerun each field report's experiment. Shares no code with the gateway.

pub mod cli;
