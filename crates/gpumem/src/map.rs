//! A small map from names, kept sorted by key: bytes by component, a page's knobs, a widget's
//! options.
//!
//! It reads and serializes like the `BTreeMap<String, V>` it replaces (a JSON object in key
//! order), but these maps hold a handful of entries, and a sorted `Vec` costs the widgets'
//! wasm far less code than a B-tree for each value type.

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SortedMap<V>(Vec<(String, V)>);

/// Bytes by component (`weights`, `activations`, …).
pub type Components = SortedMap<u64>;

/// Names to text: knobs, options.
pub type StrMap = SortedMap<String>;

impl<V> Default for SortedMap<V> {
    fn default() -> Self {
        SortedMap(Vec::new())
    }
}

impl<V> SortedMap<V> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, k: &str) -> Option<&V> {
        self.find(k).ok().map(|i| &self.0[i].1)
    }

    pub fn contains_key(&self, k: &str) -> bool {
        self.find(k).is_ok()
    }

    /// Set `k`, returning its previous value.
    pub fn insert(&mut self, k: String, v: V) -> Option<V> {
        match self.find(&k) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, v)),
            Err(i) => {
                self.0.insert(i, (k, v));
                None
            }
        }
    }

    pub fn remove(&mut self, k: &str) -> Option<V> {
        self.find(k).ok().map(|i| self.0.remove(i).1)
    }

    /// The entries in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &V)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
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

impl StrMap {
    /// A JSON object whose values are all strings; `None` for anything else.
    pub fn from_json(v: &Value) -> Option<StrMap> {
        let mut m = StrMap::new();
        for (k, v) in v.as_object()? {
            m.insert(k.clone(), v.as_str()?.to_string());
        }
        Some(m)
    }
}

/// `c["weights"]`: panics when the key is absent, as a map index does.
impl<V> std::ops::Index<&str> for SortedMap<V> {
    type Output = V;
    fn index(&self, k: &str) -> &V {
        match self.get(k) {
            Some(v) => v,
            None => panic!("no entry named {k}"),
        }
    }
}

impl<'a, V> IntoIterator for &'a SortedMap<V> {
    type Item = (&'a String, &'a V);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (String, V)>,
        fn(&'a (String, V)) -> (&'a String, &'a V),
    >;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

impl<V> IntoIterator for SortedMap<V> {
    type Item = (String, V);
    type IntoIter = std::vec::IntoIter<(String, V)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// Later entries win, as when collecting into a map.
impl<V> FromIterator<(String, V)> for SortedMap<V> {
    fn from_iter<I: IntoIterator<Item = (String, V)>>(iter: I) -> Self {
        let mut m = SortedMap::new();
        for (k, v) in iter {
            m.insert(k, v);
        }
        m
    }
}

/// A JSON object in key order, exactly as a `BTreeMap` serializes.
impl<V: Serialize> Serialize for SortedMap<V> {
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
        assert_eq!(d.remove("logits"), Some(9));
        assert_eq!(d.remove("logits"), None);
        assert_eq!((&d).into_iter().count(), 3);
        assert_eq!(
            d.into_iter().map(|(k, _)| k).collect::<Vec<_>>()[0],
            "activations"
        );
    }

    #[test]
    fn text_maps_from_json() {
        let m = StrMap::from_json(&serde_json::json!({"c": "4", "a": "5"})).unwrap();
        assert_eq!(serde_json::to_string(&m).unwrap(), r#"{"a":"5","c":"4"}"#);
        assert!(StrMap::from_json(&serde_json::json!({"a": 1})).is_none());
        assert!(StrMap::from_json(&serde_json::json!(["a"])).is_none());
        assert!(StrMap::default().is_empty());
    }
}
