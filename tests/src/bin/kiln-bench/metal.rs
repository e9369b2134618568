//! The Metal figures (`cargo xtask bench metal`): a copy, a fused chain, a
//! matmul and the host overhead of a cached call, as the wgpu group
//! measures them. Only an Apple target can take them; elsewhere they are
//! left out, with a note on stderr.

use kiln_tests::bench::{selected, BenchReport};

/// The figures of this group.
const NAMES: [&str; 4] = [
    "metal_copy_4m",
    "metal_fused_chain_100_4m",
    "metal_matmul_1024",
    "metal_host_overhead_10op",
];

/// Records the selected Metal figures where a Metal device exists.
pub fn benchmarks(names: &[String], report: &mut BenchReport) {
    if !NAMES.iter().any(|name| selected(name, names)) {
        return;
    }
    #[cfg(target_vendor = "apple")]
    apple::record(names, report);
    #[cfg(not(target_vendor = "apple"))]
    {
        let _ = report;
        eprintln!("kiln-bench: the metal figures need an Apple target; they are left out");
    }
}

#[cfg(target_vendor = "apple")]
mod apple {
    use super::super::{chain, device_ms_with, ramp, value_shapes};
    use kiln::{compile, Array, Backend, Tree};
    use kiln_metal::MetalBackend;
    use kiln_tests::bench::{median_micros, selected, BenchReport};

    /// Median milliseconds of a cached call of `f` on `args`, the device's
    /// work included (the first output read back, which waits for the
    /// call's command buffer).
    fn device_ms<In: Tree + Clone, F: Fn(In) -> Out, Out: Tree>(
        metal: &MetalBackend,
        f: &kiln::Compiled<In, Out, F, MetalBackend>,
        args: In,
        iterations: usize,
    ) -> f64 {
        device_ms_with(metal, f, args, iterations, |metal, outputs| {
            if let Some(first) = outputs.into_iter().next() {
                std::hint::black_box(metal.download(first).expect("reads back"));
            }
        })
    }

    pub fn record(names: &[String], report: &mut BenchReport) {
        let metal = match MetalBackend::new() {
            Ok(metal) => metal,
            Err(e) => {
                eprintln!("kiln-bench: {e}; the metal figures are left out");
                return;
            }
        };
        let four_m = [4 << 20];
        if selected("metal_copy_4m", names) {
            let f = compile(|x: Array| x.reshape(&[2048, 2048])).with_backend(metal.clone());
            report.record(
                "metal_copy_4m",
                device_ms(&metal, &f, ramp(&four_m), 20),
                "ms",
            );
        }
        if selected("metal_fused_chain_100_4m", names) {
            let f = compile(|x: Array| chain(x, 100)).with_backend(metal.clone());
            let ms = device_ms(&metal, &f, ramp(&four_m), 20);
            report.record("metal_fused_chain_100_4m", ms, "ms");
        }
        if selected("metal_matmul_1024", names) {
            let f = compile(|(a, b): (Array, Array)| a.matmul(&b)).with_backend(metal.clone());
            let ms = device_ms(&metal, &f, (ramp(&[1024, 1024]), ramp(&[1024, 1024])), 5);
            report.record(
                "metal_matmul_1024",
                2.0 * 1024f64.powi(3) / (ms * 1e-3) / 1e9,
                "gflops",
            );
        }
        if selected("metal_host_overhead_10op", names) {
            let f = compile(|x: Array| chain(x, 10))
                .fusion(false)
                .with_backend(metal.clone());
            let x = ramp(&[4, 4]);
            let exe = f.executable(&x).expect("compiles");
            let shapes = value_shapes(&exe, std::slice::from_ref(&x));
            let data = x.data().expect("data");
            let micros = median_micros(2_000, || {
                let input = metal.upload(&data).expect("upload");
                std::hint::black_box(metal.run(&exe, vec![input], &shapes).expect("run"));
            });
            report.record("metal_host_overhead_10op", micros, "us");
        }
    }
}
