//! Accelerators: the memory a program can really get.

/// A GPU model and the memory PyTorch sees on it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gpu {
    pub name: &'static str,
    /// `torch.cuda.mem_get_info()` total. H100-80GB is measured (tests/data); the others are
    /// nvidia-smi's published totals less the same 479 MiB the H100 shows between the two.
    pub capacity_bytes: u64,
}

const MIB: u64 = 1 << 20;

pub const GPUS: &[Gpu] = &[
    Gpu {
        name: "H100-80GB",
        capacity_bytes: 85_017_493_504,
    },
    Gpu {
        name: "H200",
        capacity_bytes: (143_771 - 479) * MIB,
    },
    Gpu {
        name: "B200",
        capacity_bytes: (183_359 - 479) * MIB,
    },
    Gpu {
        name: "A100-80GB",
        capacity_bytes: (81_920 - 479) * MIB,
    },
    Gpu {
        name: "A100-40GB",
        capacity_bytes: (40_960 - 479) * MIB,
    },
    Gpu {
        name: "L4",
        capacity_bytes: (23_034 - 479) * MIB,
    },
    Gpu {
        name: "RTX-4090",
        capacity_bytes: (24_564 - 479) * MIB,
    },
    Gpu {
        name: "RTX-3090",
        capacity_bytes: (24_576 - 479) * MIB,
    },
    Gpu {
        name: "V100-32GB",
        capacity_bytes: (32_768 - 479) * MIB,
    },
];

/// The CUDA context PyTorch creates (cuBLAS/cuDNN handles, kernels): measured on the H100
/// as `mem_get_info` used − `memory_reserved` = 787,283,968 bytes (torch 2.11, CUDA 13.0).
pub const CUDA_CONTEXT_BYTES: u64 = 787_283_968;

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
