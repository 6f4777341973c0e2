//! etcdsql: an etcd v3-compatible gRPC server that keeps its data in SQL.
//!
//! # Layout
//! A request flows down this list and back:
//! - [`server`]: the gRPC services and HTTP routes on each listener, shutdown.
//! - [`listener`]: listen URLs, TCP and Unix sockets, TLS handshakes; [`tls`] builds the TLS
//!   configuration (certificates, client-certificate auth) from etcd's flags.
//! - [`api`]: one module per etcd service. Converts protobuf to validated domain requests,
//!   calls the store, converts back; maps every error to a `tonic::Status` in one place.
//! - [`mvcc`]: etcd's semantics on a revision log — revisions, txn compares and ops, range
//!   rules, compaction — with a single writer task that commits writes in groups.
//! - [`backend`]: the log in a database; the only code with SQL.
//! - [`watch`]: the hub that tails the log and fans new revisions out to watch streams.
//! - [`lease`]: leases, keep-alives and the expiry loop.
//! - [`auth`]: users, roles, permissions and tokens (etcd's auth), kept in the database.
//! - [`concurrency`]: locks and elections (etcd's Lock and Election services) on the store,
//!   the lessor and the hub.
//! - [`pb`]: the generated protobuf types.
//! - [`compat`]: repairs what old etcd clients send that Rust's HTTP/2 stack would refuse.
//! - [`snapshot`]: snapshots and backups (a SQLite file and its checksum), and restoring them.
//! - [`import`]: reading a running etcd over its API into the backup format (`import
//!   --from-etcd`) and following it; kine's databases are read by `backend::kine`. [`export`]
//!   writes the store's keys back into an empty etcd.
//! - [`config`]: the command line.
//! - [`metrics`]: Prometheus metrics under etcd's names, a gRPC layer and a backend decorator
//!   that feed them.

pub mod api;
pub mod auth;
pub mod backend;
pub mod coalesce;
pub mod compat;
pub mod concurrency;
pub mod config;
pub mod connections;
pub mod export;
pub mod import;
pub mod lease;
pub mod listener;
pub mod metrics;
pub mod mvcc;
pub mod pb;
pub mod server;
pub mod snapshot;
pub mod tls;
pub mod watch;

pub use config::Config;
pub use server::{Running, start};
