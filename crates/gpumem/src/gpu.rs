//! Accelerators: the memory a program can really get.

/// A GPU model and the memory PyTorch sees on it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gpu {
    pub name: &'static str,
    /// `torch.cuda.mem_get_info()` total. H100-80GB is measured (tests/data); the others are
    /// nvidia-smi's published totals less the same 479 MiB the H100 shows between the two.
    pub capacity_bytes: u64,
    /// Published dense 16-bit tensor throughput with fp32 accumulation (TFLOP/s), from
    /// NVIDIA's datasheets. Only the planner's cost model uses it.
    pub tflops: f64,
    /// Per-GPU bandwidth, one direction, GB/s: within a node (NVLink, or PCIe where there is
    /// none) and between nodes (the NIC per GPU of a typical cluster of that GPU).
    pub intra_gbps: f64,
    pub inter_gbps: f64,
}

const MIB: u64 = 1 << 20;

pub const GPUS: &[Gpu] = &[
    Gpu {
        name: "H100-80GB",
        capacity_bytes: 85_017_493_504,
        tflops: 989.0,
        intra_gbps: 450.0,
        inter_gbps: 50.0,
    },
    Gpu {
        name: "H200",
        capacity_bytes: (143_771 - 479) * MIB,
        tflops: 989.0,
        intra_gbps: 450.0,
        inter_gbps: 50.0,
    },
    Gpu {
        name: "B200",
        capacity_bytes: (183_359 - 479) * MIB,
        tflops: 2250.0,
        intra_gbps: 900.0,
        inter_gbps: 100.0,
    },
    Gpu {
        name: "A100-80GB",
        capacity_bytes: (81_920 - 479) * MIB,
        tflops: 312.0,
        intra_gbps: 300.0,
        inter_gbps: 25.0,
    },
    Gpu {
        name: "A100-40GB",
        capacity_bytes: (40_960 - 479) * MIB,
        tflops: 312.0,
        intra_gbps: 300.0,
        inter_gbps: 25.0,
    },
    Gpu {
        name: "L4",
        capacity_bytes: (23_034 - 479) * MIB,
        tflops: 121.0,
        intra_gbps: 32.0,
        inter_gbps: 12.5,
    },
    Gpu {
        name: "RTX-4090",
        capacity_bytes: (24_564 - 479) * MIB,
        tflops: 82.6,
        intra_gbps: 32.0,
        inter_gbps: 12.5,
    },
    Gpu {
        name: "RTX-3090",
        capacity_bytes: (24_576 - 479) * MIB,
        tflops: 35.6,
        intra_gbps: 32.0,
        inter_gbps: 12.5,
    },
    Gpu {
        name: "V100-32GB",
        capacity_bytes: (32_768 - 479) * MIB,
        tflops: 125.0,
        intra_gbps: 150.0,
        inter_gbps: 12.5,
    },
];

/// The CUDA context PyTorch creates (cuBLAS/cuDNN handles, kernels): measured on the H100
/// as `mem_get_info` used − `memory_reserved` = 787,283,968 bytes (torch 2.11, CUDA 13.0).
pub const CUDA_CONTEXT_BYTES: u64 = 787_283_968;

/// cuBLAS's workspaces, which PyTorch allocates through its caching allocator inside the first
/// matmul of each thread that multiplies matrices and keeps to the process's end: the
/// forward's thread and, in training, autograd's backward thread. They are in every figure of
/// the allocated memory from then on (`max_memory_allocated` of a fresh process counts them):
/// 2 × 32 MiB in every training run of `tests/data/oracle/cuda.jsonl` on the H100.
pub fn cublas_workspaces(s: &crate::Scenario) -> u64 {
    let threads = if s.mode == crate::scenario::Mode::Train {
        2
    } else {
        1
    };
    threads * crate::alloc::stream::cublas_workspace(&s.gpu_name)
}

pub fn find(name: &str) -> Option<Gpu> {
    let norm = |s: &str| s.to_ascii_lowercase().replace(['-', '_', ' '], "");
    let n = norm(name);
    GPUS.iter().copied().find(|g| {
        let g_n = norm(g.name);
        g_n == n
            || g_n.trim_end_matches("gb") == n
            || (n == "h100" && g.name == "H100-80GB")
            || (n == "a100" && g.name == "A100-80GB")
    })
}
