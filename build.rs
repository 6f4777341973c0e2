//! Compiles etcd's wire protocol from `proto/` with protox (pure Rust), so a fresh checkout needs
//! no system `protoc`.

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
    tonic_prost_build::configure()
        .build_client(false)
        .compile_fds(descriptors)?;
    Ok(())
}
