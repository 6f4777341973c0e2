//! Compiles etcd's wire protocol from `proto/` with protox (pure Rust), so a fresh checkout needs
//! no system `protoc`; and, with pbjson, protobuf's JSON mapping for the same types, which the
//! `/v3/*` gateway speaks (field names as the protos spell them, as etcd's gateway writes them).

use protox::prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/mvccpb/kv.proto",
        "proto/authpb/auth.proto",
        "proto/etcdserverpb/rpc.proto",
        "proto/v3lockpb/v3lock.proto",
        "proto/v3electionpb/v3election.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    let encoded = descriptors.encode_to_vec();
    tonic_prost_build::configure()
        .build_client(true)
        // Sizes each response's buffer before encoding it (src/api/codec.rs).
        .codec_path("crate::api::codec::SizedCodec")
        .compile_fds(descriptors)?;
    pbjson_build::Builder::new()
        .register_descriptors(&encoded)?
        .preserve_proto_field_names()
        .ignore_unknown_fields()
        .build(&[
            ".mvccpb",
            ".authpb",
            ".etcdserverpb",
            ".v3lockpb",
            ".v3electionpb",
        ])?;
    Ok(())
}
