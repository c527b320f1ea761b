//! Bytes by component (`weights`, `activations`, …): a handful of entries kept sorted by name.
//!
//! It reads and serializes like the `BTreeMap<String, u64>` it replaces (a JSON object in key
//! order), but a sorted `Vec` costs the widgets' wasm far less code than a B-tree.

use serde::ser::{Serialize, SerializeMap, Serializer};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Components(Vec<(String, u64)>);

impl Components {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, k: &str) -> Option<&u64> {
        self.find(k).ok().map(|i| &self.0[i].1)
    }

    pub fn contains_key(&self, k: &str) -> bool {
        self.find(k).is_ok()
    }

    /// Set `k`, returning its previous value.
    pub fn insert(&mut self, k: String, v: u64) -> Option<u64> {
        match self.find(&k) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, v)),
            Err(i) => {
                self.0.insert(i, (k, v));
                None
            }
        }
    }

    /// The entries in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &u64)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = &u64> {
        self.0.iter().map(|(_, v)| v)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn find(&self, k: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(key, _)| key.as_str().cmp(k))
    }
}

/// `c["weights"]`: panics when the component is absent, as a map index does.
impl std::ops::Index<&str> for Components {
    type Output = u64;
    fn index(&self, k: &str) -> &u64 {
        match self.get(k) {
            Some(v) => v,
            None => panic!("no component named {k}"),
        }
    }
}

impl<'a> IntoIterator for &'a Components {
    type Item = (&'a String, &'a u64);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (String, u64)>,
        fn(&'a (String, u64)) -> (&'a String, &'a u64),
    >;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

/// Later entries win, as when collecting into a map.
impl FromIterator<(String, u64)> for Components {
    fn from_iter<I: IntoIterator<Item = (String, u64)>>(iter: I) -> Self {
        let mut c = Components::new();
        for (k, v) in iter {
            c.insert(k, v);
        }
        c
    }
}

/// A JSON object in name order, exactly as a `BTreeMap` serializes.
impl Serialize for Components {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn reads_and_serializes_like_a_btreemap() {
        let pairs = [
            ("weights", 4),
            ("activations", 0),
            ("logits", 9),
            ("weights", 5),
        ];
        let c: Components = pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        let b: BTreeMap<String, u64> = pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            serde_json::to_string(&b).unwrap()
        );
        assert!(c.iter().eq(b.iter()));
        assert!(c.keys().eq(b.keys()));
        assert_eq!(c.values().sum::<u64>(), 14);
        assert_eq!((c["logits"], c.get("kv_cache"), c.len()), (9, None, 3));
        assert!(c.contains_key("activations") && !c.is_empty());
        let mut d = c.clone();
        assert_eq!(d.insert("kv_cache".into(), 1), None);
        assert_eq!(d.insert("kv_cache".into(), 2), Some(1));
        assert_eq!((&d).into_iter().count(), 4);
    }
}
