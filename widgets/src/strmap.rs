//! A small map of strings, kept sorted by key: the knobs and a widget's options.
//!
//! A page has a few dozen knobs at most, so a sorted `Vec` does everything a `BTreeMap` did
//! here, with far less code in the wasm (the engine's maps already bring one B-tree).

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StrMap(Vec<(String, String)>);

impl StrMap {
    pub fn get(&self, k: &str) -> Option<&String> {
        self.find(k).ok().map(|i| &self.0[i].1)
    }

    /// Set `k`, returning its previous value.
    pub fn insert(&mut self, k: String, v: String) -> Option<String> {
        match self.find(&k) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, v)),
            Err(i) => {
                self.0.insert(i, (k, v));
                None
            }
        }
    }

    pub fn remove(&mut self, k: &str) -> Option<String> {
        self.find(k).ok().map(|i| self.0.remove(i).1)
    }

    /// The pairs in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A JSON object whose values are all strings; `None` for anything else.
    pub fn from_json(v: &Value) -> Option<StrMap> {
        let mut m = StrMap::default();
        for (k, v) in v.as_object()? {
            m.insert(k.clone(), v.as_str()?.to_string());
        }
        Some(m)
    }

    fn find(&self, k: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(key, _)| key.as_str().cmp(k))
    }
}

/// Later pairs win, as when collecting into a map.
impl FromIterator<(String, String)> for StrMap {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        let mut m = StrMap::default();
        for (k, v) in iter {
            m.insert(k, v);
        }
        m
    }
}

impl IntoIterator for StrMap {
    type Item = (String, String);
    type IntoIter = std::vec::IntoIter<(String, String)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// A JSON object, keys in order.
impl Serialize for StrMap {
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

    #[test]
    fn behaves_like_a_sorted_map() {
        let mut m: StrMap = [("b", "1"), ("a", "2"), ("b", "3")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(m.get("b").map(String::as_str), Some("3"));
        assert_eq!(m.len(), 2);
        assert_eq!(m.insert("c".into(), "4".into()), None);
        assert_eq!(m.insert("a".into(), "5".into()), Some("2".into()));
        assert_eq!(m.remove("b"), Some("3".into()));
        assert_eq!(m.remove("b"), None);
        assert_eq!(serde_json::to_string(&m).unwrap(), r#"{"a":"5","c":"4"}"#);
        let back = StrMap::from_json(&serde_json::json!({"c": "4", "a": "5"})).unwrap();
        assert_eq!(back, m);
        assert!(StrMap::from_json(&serde_json::json!({"a": 1})).is_none());
        assert!(StrMap::from_json(&serde_json::json!(["a"])).is_none());
        assert!(StrMap::default().is_empty());
    }
}
