//! Prints the default adapter, whether it has SHADER_F16, and its limits.
fn main() {
    match kiln_wgpu::WgpuBackend::new() {
        Ok(gpu) => {
            println!("adapter: {}", gpu.adapter());
            println!("shader f16: {}", gpu.has_shader_f16());
            let limits = gpu.limits();
            println!(
                "max storage binding: {} bytes, max workgroups per dimension: {}",
                limits.max_storage_buffer_binding_size, limits.max_compute_workgroups_per_dimension
            );
        }
        Err(e) => println!("no adapter: {e}"),
    }
}
