//! etcd's wire protocol, generated from `proto/` at build time, with protobuf's JSON mapping
//! (pbjson) for the `/v3/*` gateway.

#![allow(clippy::all, clippy::pedantic, missing_docs)]

pub mod mvccpb {
    tonic::include_proto!("mvccpb");
    include!(concat!(env!("OUT_DIR"), "/mvccpb.serde.rs"));
}

pub mod authpb {
    tonic::include_proto!("authpb");
    include!(concat!(env!("OUT_DIR"), "/authpb.serde.rs"));
}

pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.serde.rs"));
}

pub mod v3lockpb {
    tonic::include_proto!("v3lockpb");
    include!(concat!(env!("OUT_DIR"), "/v3lockpb.serde.rs"));
}

pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
    include!(concat!(env!("OUT_DIR"), "/v3electionpb.serde.rs"));
}
