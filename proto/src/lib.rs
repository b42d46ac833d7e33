pub mod v1 {
    tonic::include_proto!("nova.v1");
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("nova_v1_descriptor");
}
