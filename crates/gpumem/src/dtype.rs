//! Numeric formats and their storage cost.

use std::fmt;

/// A storage format for tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    Bf16,
    F16,
    F8,
    I8,
    I4,
    /// bitsandbytes NF4 with double quantisation (QLoRA's storage format).
    Nf4,
}

impl DType {
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::Bf16,
        DType::F16,
        DType::F8,
        DType::I8,
        DType::I4,
        DType::Nf4,
    ];

    /// Bytes per element, quantisation constants included.
    ///
    /// NF4 (bitsandbytes, blocksize 64, double quantisation as QLoRA uses): 4 bits per weight,
    /// one 8-bit absmax per 64 weights, and one fp32 second-level constant per 256 absmaxes
    /// (Dettmers et al. 2023, §3): 0.5 + 1/64 + 4/(64·256) bytes. Plain int4 is counted with
    /// an fp16 scale per group of 128 (GPTQ/AWQ's usual layout): 0.5 + 2/128.
    pub fn bytes(self) -> f64 {
        match self {
            DType::F32 => 4.0,
            DType::Bf16 | DType::F16 => 2.0,
            DType::F8 | DType::I8 => 1.0,
            DType::I4 => 0.5 + 2.0 / 128.0,
            DType::Nf4 => 0.5 + 1.0 / 64.0 + 4.0 / (64.0 * 256.0),
        }
    }

    /// Formats activations and gradients can be computed in.
    pub fn is_float_compute(self) -> bool {
        matches!(self, DType::F32 | DType::Bf16 | DType::F16)
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "fp32",
            DType::Bf16 => "bf16",
            DType::F16 => "fp16",
            DType::F8 => "fp8",
            DType::I8 => "int8",
            DType::I4 => "int4",
            DType::Nf4 => "nf4",
        }
    }

    pub fn parse(s: &str) -> Option<DType> {
        Some(match s.to_ascii_lowercase().as_str() {
            "fp32" | "f32" | "float32" | "float" => DType::F32,
            "bf16" | "bfloat16" => DType::Bf16,
            "fp16" | "f16" | "float16" | "half" => DType::F16,
            "fp8" | "f8" | "float8" | "e4m3" | "e5m2" => DType::F8,
            "int8" | "i8" => DType::I8,
            "int4" | "i4" => DType::I4,
            "nf4" => DType::Nf4,
            _ => return None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
