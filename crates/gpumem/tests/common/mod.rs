//! Shared by the property tests.

use proptest::prelude::ProptestConfig;

/// A property's configuration: `PROPTEST_CASES` when it is set (to explore), else `default`
/// (what CI runs, with its fixed `PROPTEST_RNG_SEED`).
pub fn cases(default: u32) -> ProptestConfig {
    let mut c = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = default;
    }
    c
}
