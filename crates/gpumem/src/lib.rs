//! gpumem: predicts the per-GPU memory of LLM training and inference the way PyTorch measures it.
//!
//! scenario → architecture → parameter counts → bytes per component → per-GPU peak.
pub mod alloc;
pub mod arch;
pub mod dtype;
pub mod error;
pub mod estimate;
pub mod gpu;
pub mod graph;
pub mod hf;
pub mod knobs;
pub mod ledger;
pub mod map;
pub mod megatron;
pub mod mem;
pub mod num;
pub mod order;
pub mod params;
pub mod plan;
pub mod precision;
pub mod presets;
pub mod scenario;
pub mod step;
pub mod tape;
pub mod timeline;
pub mod validation;

pub use error::{Error, Result};
pub use estimate::{estimate, Estimate};
pub use scenario::Scenario;

/// Parse a scenario from JSON text and estimate it.
pub fn estimate_json(text: &str) -> Result<Estimate> {
    estimate(&Scenario::from_json_str(text)?)
}
