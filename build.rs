//! Compiles the gRPC API with protox (pure Rust, no system protoc) and writes the file
//! descriptor set that server reflection serves.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/spark/allocator/v1/allocator.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("allocator_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .codec_path("crate::grpc::codec::ApiCodec")
        .compile_fds(descriptors)?;
    Ok(())
}
