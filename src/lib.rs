//! etcdsql: an etcd v3-compatible gRPC server that keeps its data in SQL.
//!
//! # Layout
//! A request flows down this list and back:
//! - [`server`]: listeners, the gRPC services and HTTP routes on one port, shutdown.
//! - [`api`]: one module per etcd service. Converts protobuf to validated domain requests,
//!   calls the store, converts back; maps every error to a `tonic::Status` in one place.
//! - [`mvcc`]: etcd's semantics on a revision log — revisions, txn compares and ops, range
//!   rules, compaction — with a single writer task that commits writes in groups.
//! - [`backend`]: the log in a database; the only code with SQL.
//! - [`watch`]: the hub that tails the log and fans new revisions out to watch streams.
//! - [`lease`]: leases, keep-alives and the expiry loop.
//! - [`pb`]: the generated protobuf types.
//! - [`compat`]: repairs what old etcd clients send that Rust's HTTP/2 stack would refuse.
//! - [`config`]: the command line.

pub mod api;
pub mod backend;
pub mod compat;
pub mod config;
pub mod lease;
pub mod mvcc;
pub mod pb;
pub mod server;
pub mod watch;

pub use config::Config;
pub use server::{Running, start};
