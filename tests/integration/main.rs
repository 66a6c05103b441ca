//! Integration tests: binaries run as a user runs them.

mod bad_shards;
mod killed_writer;
