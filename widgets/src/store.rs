//! The page's shared knobs: one scenario per chapter that every page-scoped widget of that
//! chapter reads and writes, like the cells of a notebook (print.html holds every chapter,
//! each with its own). Each live widget is its own Yew app, so the store lives outside
//! Yew: widgets subscribe when they mount and publish when a reader moves a control.
//!
//! A change reaches the widgets on screen (or near it) at once; a widget off screen is told
//! when it comes near the screen, or once the knobs have rested, whichever is first (the
//! page's script watches both and calls [`set_near`]: `loader.js`). A slider then redraws what the reader sees
//! within the frame, however many widgets the chapter has.

use std::cell::RefCell;

use yew::Callback;

use crate::Knobs;

/// The knobs and subscribers of one chapter. A page is usually one chapter; mdBook's
/// print.html holds them all, each with its own scenario.
struct Group {
    page: String,
    knobs: Option<Knobs>,
    subscribers: Vec<Subscriber>,
}

/// A widget listening to its chapter's knobs.
struct Subscriber {
    id: usize,
    /// The widget's uid (its host is watched under it).
    uid: String,
    on_change: Callback<Knobs>,
    /// On screen or near it (until the page says otherwise).
    near: bool,
    /// Knobs it has not been told yet, being off screen.
    pending: Option<Knobs>,
}

#[derive(Default)]
struct Store {
    groups: Vec<Group>,
    next_id: usize,
    /// Chapters on this document (set when the page starts); the URL carries the state only
    /// when there is one.
    chapters: usize,
}

impl Store {
    fn group(&mut self, page: &str) -> &mut Group {
        let i = match self.groups.iter().position(|g| g.page == page) {
            Some(i) => i,
            None => {
                self.groups.push(Group {
                    page: page.to_string(),
                    knobs: None,
                    subscribers: Vec::new(),
                });
                self.groups.len() - 1
            }
        };
        &mut self.groups[i]
    }
}

thread_local! {
    static STORE: RefCell<Store> = RefCell::new(Store::default());
}

/// A subscription; dropping it unsubscribes.
pub struct Subscription(usize);

impl Drop for Subscription {
    fn drop(&mut self) {
        STORE.with(|s| {
            for g in s.borrow_mut().groups.iter_mut() {
                g.subscribers.retain(|x| x.id != self.0);
            }
        });
    }
}

/// Join a chapter's widgets as the widget `uid`: the first widget's knobs become the
/// chapter's. Returns the chapter's knobs now. A subscriber with no uid (`""`) is told of
/// changes only once the knobs rest (`set_near("", false)`): a costly part of a widget, such
/// as the 5D panel's planner, that need not follow a slider frame by frame.
pub fn join(
    page: &str,
    uid: &str,
    initial: &Knobs,
    on_change: Callback<Knobs>,
) -> (Knobs, Subscription) {
    STORE.with(|s| {
        let mut s = s.borrow_mut();
        let id = s.next_id;
        s.next_id += 1;
        let g = s.group(page);
        let current = g.knobs.get_or_insert_with(|| initial.clone()).clone();
        g.subscribers.push(Subscriber {
            id,
            uid: uid.to_string(),
            on_change,
            near: !uid.is_empty(),
            pending: None,
        });
        (current, Subscription(id))
    })
}

/// Where the widget `uid` is: on screen or near it, or not. Either way it is told the knobs
/// it has missed: the page's script says so when the widget comes near the screen, and, for
/// each widget off screen, once the knobs have rested.
pub fn set_near(uid: &str, near: bool) {
    tell_missed(Some((uid, near)));
}

/// Tell widgets the knobs they have missed: the widget `uid`, now near or not; or, none
/// named, every widget near the screen.
fn tell_missed(only: Option<(&str, bool)>) {
    let mut missed: Vec<(Callback<Knobs>, Knobs)> = Vec::new();
    STORE.with(|s| {
        for g in s.borrow_mut().groups.iter_mut() {
            for x in g.subscribers.iter_mut() {
                if let Some((uid, near)) = only {
                    if x.uid != uid {
                        continue;
                    }
                    x.near = near;
                } else if !x.near {
                    continue;
                }
                if let Some(k) = x.pending.take() {
                    missed.push((x.on_change.clone(), k));
                }
            }
        }
    });
    for (c, k) in missed {
        c.emit(k);
    }
}

/// Set a chapter's knobs and tell the widgets of that chapter: those near the screen now,
/// the others when they come near or the knobs rest.
pub fn publish(page: &str, knobs: Knobs) {
    STORE.with(|s| {
        let mut s = s.borrow_mut();
        let g = s.group(page);
        g.knobs = Some(knobs.clone());
        for x in g.subscribers.iter_mut() {
            x.pending = Some(knobs.clone());
        }
    });
    // (Told after the store is let go: a subscriber may (un)subscribe while it is told.)
    tell_missed(None);
    // The page's script (loader.js) tells the widgets off screen, and has the URL written
    // (`url::flush`), once the changes it hears of rest.
    #[cfg(target_arch = "wasm32")]
    page_events::changed(&knobs);
}

/// Set a chapter's knobs before any of its widgets joins (from the URL).
pub fn seed(page: &str, knobs: Knobs) {
    STORE.with(|s| s.borrow_mut().group(page).knobs = Some(knobs));
}

/// How many chapters this document holds (print.html: all of them).
pub fn set_chapters(n: usize) {
    STORE.with(|s| s.borrow_mut().chapters = n);
}

/// The chapters that have knobs, in the order they joined.
pub fn pages() -> Vec<String> {
    STORE.with(|s| s.borrow().groups.iter().map(|g| g.page.clone()).collect())
}

/// The query string that carries knobs: `?model=llama3.1-8b&batch=4`, in the engine's knob
/// order, values percent-encoded. Unknown parameters are not ours and are left alone.
pub fn to_query(k: &Knobs) -> String {
    let mut out = String::new();
    for key in gpumem::knobs::KNOBS {
        if let Some(v) = k.get(key) {
            if !out.is_empty() {
                out.push('&');
            }
            out.push_str(key);
            out.push('=');
            percent(&mut out, v);
        }
    }
    out
}

/// Append `v` percent-encoded: bytes other than letters, digits and `-._~+` as `%XX`.
fn percent(out: &mut String, v: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for b in v.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'+' => {
                out.push(b as char)
            }
            _ => {
                out.push('%');
                out.push(HEX[usize::from(b >> 4)] as char);
                out.push(HEX[usize::from(b & 15)] as char);
            }
        }
    }
}

fn unpercent(v: &str) -> Option<String> {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let digit = |j: usize| char::from(*b.get(j)?).to_digit(16);
            out.push((digit(i + 1)? * 16 + digit(i + 2)?) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The longest query string read: a permalink's knobs take a few hundred bytes, an `arch`
/// knob about a thousand.
pub const MAX_QUERY_BYTES: usize = 8 << 10;

/// The most knobs one `gpumem:set` may carry (there are far fewer knobs than this).
pub const MAX_SET_KEYS: usize = 256;

/// The longest `gpumem:set` detail read, as JSON text.
pub const MAX_SET_BYTES: usize = 64 << 10;

/// The page's knobs with a query string's knobs applied, if the query carries any: the
/// engine checks the result, and an invalid one is an error naming what is wrong. A query
/// longer than [`MAX_QUERY_BYTES`] is refused unread.
pub fn from_query(defaults: &Knobs, query: &str) -> Option<Result<Knobs, String>> {
    if query.len() > MAX_QUERY_BYTES {
        return Some(Err(format!(
            "the query string is longer than {} KiB",
            MAX_QUERY_BYTES >> 10
        )));
    }
    let mut k = defaults.clone();
    let mut any = false;
    for pair in query.trim_start_matches('?').split('&') {
        let (key, v) = pair.split_once('=').unwrap_or((pair, ""));
        if !gpumem::knobs::KNOBS.contains(&key) {
            continue;
        }
        any = true;
        let Some(v) = unpercent(v) else {
            return Some(Err(format!("{key}: not a valid encoded value")));
        };
        if v.len() > gpumem::knobs::MAX_VALUE_LEN {
            return Some(Err(format!("{key}: value too long")));
        }
        k.0.insert(key.to_string(), v);
    }
    if !any {
        return None;
    }
    Some(match k.scenario() {
        Ok(_) => Ok(k),
        Err(e) => Err(e.to_string()),
    })
}

/// The page's state in its URL: written once the knobs rest (history.replaceState, so the back
/// button is not flooded), read once when the page starts.
#[cfg(target_arch = "wasm32")]
pub mod url {
    use crate::Knobs;

    /// Carry the page's knobs in the URL (on a page of one chapter). The page's script calls
    /// this once the knobs rest, and a copied link before it reads the URL: not on every change,
    /// as Chromium ignores `history.replaceState` past 200 calls in 10 s, which a slider's drag
    /// reaches.
    pub fn flush() {
        super::STORE.with(|s| {
            let s = s.borrow();
            if let (0 | 1, Some(super::Group { knobs: Some(k), .. })) =
                (s.chapters, s.groups.first())
            {
                write(k);
            }
        });
    }

    fn write(k: &Knobs) {
        // Keep parameters that are not knobs (mdBook's `search`, `highlight`, …).
        rewrite(
            &|key| !gpumem::knobs::KNOBS.contains(&key),
            &super::to_query(k),
        );
    }

    /// The sweep's axis, which is not a knob, carried by the URL (`scale=log` or
    /// `scale=linear`) so that a copied link brings it back: `loader.js` hands it to the
    /// sweep as its `scale` option when the page starts.
    pub fn set_scale(log: bool) {
        rewrite(
            &|k| k != "scale",
            if log { "scale=log" } else { "scale=linear" },
        );
    }

    /// The URL with the parameters `keep` keeps, then `ours`.
    fn rewrite(keep: &dyn Fn(&str) -> bool, ours: &str) {
        let Some(w) = web_sys::window() else {
            return;
        };
        let loc = w.location();
        let mut url = loc.pathname().unwrap_or_default();
        let mut sep = '?';
        let search = loc.search().unwrap_or_default();
        for p in search.trim_start_matches('?').split('&') {
            let key = p.split('=').next().unwrap_or("");
            if !p.is_empty() && keep(key) {
                url.push(sep);
                url.push_str(p);
                sep = '&';
            }
        }
        if !ours.is_empty() {
            url.push(sep);
            url.push_str(ours);
        }
        url.push_str(&loc.hash().unwrap_or_default());
        if let Ok(h) = w.history() {
            let _ = h.replace_state_with_url(&wasm_bindgen::JsValue::NULL, "", Some(&url));
        }
    }

    /// Apply the URL's knobs over the chapter's defaults; a refused URL leaves the defaults
    /// and says so on the page (as text: nothing from the URL becomes markup).
    pub fn read(page: &str, defaults: &Knobs) {
        let Some(w) = web_sys::window() else {
            return;
        };
        let search = w.location().search().unwrap_or_default();
        match super::from_query(defaults, &search) {
            None => {}
            Some(Ok(k)) => super::seed(page, k),
            Some(Err(msg)) => notice(&format!(
                "This link's widget settings were not applied ({msg}); the page shows its own."
            )),
        }
    }

    pub fn notice(msg: &str) {
        let Some(doc) = web_sys::window().and_then(|w| w.document()) else {
            return;
        };
        let Ok(el) = doc.create_element("div") else {
            return;
        };
        el.set_class_name("gm-notice");
        let _ = el.set_attribute("role", "alert");
        el.set_text_content(Some(msg));
        if let Some(main) = doc.query_selector("main").ok().flatten() {
            let _ = main.prepend_with_node_1(&el);
        }
    }
}

/// The page's knobs as DOM events, for readers' own scripts: every change is announced as
/// `gpumem:change` on `document` (detail: the knobs), and a `gpumem:set` event whose detail
/// is an object of knobs changes them. What `gpumem:set` carries is data: bounded (see
/// [`apply_set`](super::apply_set)), each key checked against the knobs' names and the result
/// by the engine, and an invalid set is refused with a console warning, the page's knobs
/// unchanged.
#[cfg(target_arch = "wasm32")]
pub mod page_events {
    use wasm_bindgen::prelude::*;
    use wasm_bindgen::JsCast;

    use crate::Knobs;

    pub fn changed(knobs: &Knobs) {
        let Some(doc) = web_sys::window().and_then(|w| w.document()) else {
            return;
        };
        let Ok(json) = serde_json::to_string(knobs) else {
            return;
        };
        let init = web_sys::CustomEventInit::new();
        if let Ok(detail) = js_sys::JSON::parse(&json) {
            init.set_detail(&detail);
        }
        if let Ok(ev) = web_sys::CustomEvent::new_with_event_init_dict("gpumem:change", &init) {
            let _ = doc.dispatch_event(&ev);
        }
    }

    /// Listen for `gpumem:set` on `document`.
    pub fn listen() {
        let Some(doc) = web_sys::window().and_then(|w| w.document()) else {
            return;
        };
        let on_set = Closure::<dyn Fn(web_sys::Event)>::new(|e: web_sys::Event| {
            let Some(ce) = e.dyn_ref::<web_sys::CustomEvent>() else {
                return;
            };
            // Every chapter on the document takes the set (print.html holds them all), each
            // checked against its own knobs.
            for page in super::pages() {
                match apply(&page, &ce.detail()) {
                    Ok(k) => super::publish(&page, k),
                    Err(msg) => {
                        web_sys::console::warn_1(&format!("gpumem:set refused: {msg}").into())
                    }
                }
            }
        });
        let _ = doc.add_event_listener_with_callback("gpumem:set", on_set.as_ref().unchecked_ref());
        on_set.forget();
    }

    /// The page's knobs with the event's detail applied, if valid. An object with too many
    /// keys is refused before it is even serialized.
    fn apply(page: &str, detail: &JsValue) -> Result<Knobs, String> {
        if detail.is_object() && !js_sys::Array::is_array(detail) {
            let keys =
                js_sys::Object::keys(detail.unchecked_ref::<js_sys::Object>()).length() as usize;
            if keys > super::MAX_SET_KEYS {
                return Err(super::too_many_keys(keys));
            }
        }
        let text = js_sys::JSON::stringify(detail)
            .ok()
            .and_then(|s| s.as_string())
            .unwrap_or_default();
        super::apply_set(&super::current(page).unwrap_or_default(), &text)
    }
}

fn too_many_keys(n: usize) -> String {
    format!("{n} keys; a gpumem:set carries at most {MAX_SET_KEYS}")
}

/// `knobs` with a `gpumem:set` detail (a JSON object of knob → value) applied, if valid.
/// Linear in the detail's size: its length and key count are bounded, every key is checked
/// against the knobs' names before anything is applied, and the engine runs once.
pub fn apply_set(knobs: &Knobs, text: &str) -> Result<Knobs, String> {
    if text.len() > MAX_SET_BYTES {
        return Err(format!(
            "the detail is longer than {} KiB",
            MAX_SET_BYTES >> 10
        ));
    }
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| gpumem::error::json_fault(&e))?;
    let obj = v.as_object().ok_or("detail must be an object of knobs")?;
    if obj.len() > MAX_SET_KEYS {
        return Err(too_many_keys(obj.len()));
    }
    if let Some(key) = obj
        .keys()
        .find(|key| !gpumem::knobs::KNOBS.contains(&key.as_str()))
    {
        return Err(format!(
            "'{}' is not a knob (knobs: {})",
            gpumem::knobs::shown(key),
            gpumem::knobs::KNOBS.join(", ")
        ));
    }
    let mut k = knobs.clone();
    for (key, val) in obj {
        let s = match val {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            _ => return Err(format!("{key}: must be a string or a number")),
        };
        k.0.insert(key.clone(), s);
    }
    k.scenario().map_err(|e| e.to_string())?;
    Ok(k)
}

/// A chapter's knobs, once a widget has joined.
pub fn current(page: &str) -> Option<Knobs> {
    STORE.with(|s| {
        s.borrow()
            .groups
            .iter()
            .find(|g| g.page == page)
            .and_then(|g| g.knobs.clone())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn the_query_string_round_trips_and_refuses_hostile_state() {
        let page = Knobs::default()
            .with("model", "llama3.1-8b")
            .with("batch", "1");
        let k = page
            .with("batch", "4")
            .with("seq", "8k")
            .with("precision", "mixed-bf16");
        let q = to_query(&k);
        assert_eq!(q, "model=llama3.1-8b&batch=4&seq=8k&precision=mixed-bf16");
        assert_eq!(from_query(&page, &format!("?{q}")), Some(Ok(k)));
        // Not ours: ignored.
        assert_eq!(from_query(&page, "?search=zero&highlight=x"), None);
        // Hostile or wrong: refused with the knob named, never applied.
        let bad = from_query(&page, "?model=%3Cscript%3Ealert(1)%3C%2Fscript%3E").unwrap();
        assert!(bad.unwrap_err().starts_with("model"));
        assert!(from_query(&page, "?batch=0").unwrap().is_err());
        assert!(from_query(&page, "?seq=%ZZ").unwrap().is_err());
        assert!(from_query(&page, &format!("?gpu={}", "x".repeat(500)))
            .unwrap()
            .is_err());
    }

    #[test]
    fn values_are_percent_encoded_and_decoded_byte_for_byte() {
        for v in [
            "a-b.c_d~e+f",
            "{\"x\": [1, 2]} & = ? # %",
            "Ünïcödé · 8×H100",
            "",
        ] {
            let mut q = String::new();
            percent(&mut q, v);
            assert!(
                q.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._~+%".contains(&b)),
                "{q}"
            );
            assert_eq!(unpercent(&q).as_deref(), Some(v), "{q}");
        }
        assert_eq!(unpercent("%3c%3E").as_deref(), Some("<>"));
        // A broken escape, or bytes that are not UTF-8, are refused.
        for bad in ["%", "%4", "%G0", "%+1", "%-1", "%FF"] {
            assert_eq!(unpercent(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_over_long_query_is_refused_unread() {
        let page = Knobs::default().with("model", "llama3.1-8b");
        let q = format!("?batch=2&search={}", "x".repeat(MAX_QUERY_BYTES));
        let e = from_query(&page, &q).unwrap().unwrap_err();
        assert!(e.contains("8 KiB"), "{e}");
        // Just under the cap, a query with knobs is read as usual.
        let q = format!("?batch=2&search={}", "x".repeat(MAX_QUERY_BYTES - 100));
        assert_eq!(from_query(&page, &q), Some(Ok(page.with("batch", "2"))));
    }

    #[test]
    fn a_set_is_bounded_checked_key_by_key_and_applied_once() {
        let page = Knobs::default().with("model", "llama3.1-8b");
        assert_eq!(
            apply_set(&page, r#"{"batch": 4, "seq": "4k"}"#),
            Ok(page.with("batch", "4").with("seq", "4k"))
        );
        let e = apply_set(&page, r#"{"batch": 4, "bogus": 1}"#).unwrap_err();
        assert!(e.starts_with("'bogus' is not a knob"), "{e}");
        // 20,000 keys: refused on the count, before any is looked at.
        let many: serde_json::Map<String, serde_json::Value> = (0..20_000)
            .map(|i| (format!("k{i}"), serde_json::Value::from(i)))
            .collect();
        let text = serde_json::Value::Object(many).to_string();
        let e = apply_set(&page, &text).unwrap_err();
        assert!(e.contains("64 KiB"), "{e}");
        let some: serde_json::Map<String, serde_json::Value> = (0..300)
            .map(|i| (format!("k{i}"), serde_json::Value::from(i)))
            .collect();
        let e = apply_set(&page, &serde_json::Value::Object(some).to_string()).unwrap_err();
        assert_eq!(e, "300 keys; a gpumem:set carries at most 256");
        assert!(apply_set(&page, r#"{"batch": 0}"#)
            .unwrap_err()
            .starts_with("batch"));
        assert!(apply_set(&page, r#""batch=9""#).is_err());
    }

    #[test]
    fn first_joiner_sets_the_page_and_publish_reaches_everyone() {
        let seen = Rc::new(RefCell::new(Vec::new()));
        let a = Knobs::default().with("batch", "2");
        let b = Knobs::default().with("batch", "8");
        let log = seen.clone();
        let (got_a, sub_a) = join(
            "budget",
            "budget-1",
            &a,
            Callback::from(move |k: Knobs| log.borrow_mut().push(k)),
        );
        let (got_b, sub_b) = join("budget", "budget-2", &b, Callback::from(|_| {}));
        assert_eq!(got_a, a);
        assert_eq!(got_b, a, "the page's knobs win over a later widget's");
        // Another chapter on the same document (print.html) keeps its own knobs.
        let (got_c, sub_c) = join("zero", "zero-1", &b, Callback::from(|_| {}));
        assert_eq!(got_c, b);
        publish("budget", b.clone());
        assert_eq!(seen.borrow().as_slice(), std::slice::from_ref(&b));
        publish("zero", a.clone());
        assert_eq!(
            seen.borrow().len(),
            1,
            "a chapter's change stays in that chapter"
        );
        assert_eq!(current("zero"), Some(a.clone()));
        drop(sub_a);
        publish("budget", a.clone());
        assert_eq!(seen.borrow().len(), 1, "unsubscribed on drop");
        drop((sub_b, sub_c));
    }

    /// A subscriber that records what it is told in `seen`.
    fn log(seen: &Rc<RefCell<Vec<Knobs>>>) -> Callback<Knobs> {
        let seen = seen.clone();
        Callback::from(move |k: Knobs| seen.borrow_mut().push(k))
    }

    #[test]
    fn a_widget_off_screen_is_told_when_it_comes_near_or_the_knobs_rest() {
        let (near, far) = (
            Rc::new(RefCell::new(Vec::new())),
            Rc::new(RefCell::new(Vec::new())),
        );
        let k0 = Knobs::default().with("batch", "1");
        let (_, sub_n) = join("off", "off-1", &k0, log(&near));
        let (_, sub_f) = join("off", "off-2", &k0, log(&far));
        set_near("off-2", false);
        let (k1, k2) = (k0.with("batch", "2"), k0.with("batch", "3"));
        publish("off", k1.clone());
        publish("off", k2.clone());
        assert_eq!(near.borrow().as_slice(), [k1.clone(), k2.clone()]);
        assert!(far.borrow().is_empty(), "off screen: not told yet");
        // Coming near, it is told the latest knobs once.
        set_near("off-2", true);
        assert_eq!(far.borrow().as_slice(), std::slice::from_ref(&k2));
        set_near("off-2", true);
        assert_eq!(far.borrow().len(), 1);
        // Off screen again: the knobs resting (the page says it is still off screen) bring it
        // up to date, once.
        set_near("off-2", false);
        let k3 = k0.with("batch", "4");
        publish("off", k3.clone());
        assert_eq!(far.borrow().len(), 1);
        set_near("off-2", false);
        set_near("off-2", false);
        assert_eq!(far.borrow().as_slice(), [k2, k3.clone()]);
        assert_eq!(near.borrow().last(), Some(&k3));
        drop((sub_n, sub_f));
    }

    /// The 5D panel's planner waits for the knobs to rest, on screen too: a slider moves the
    /// rest of the panel frame by frame, and the plan follows once the reader stops (the
    /// page's script says so: `near("", false)`).
    #[test]
    fn a_part_that_waits_for_rest_is_told_once_the_knobs_rest() {
        let (now, later) = (
            Rc::new(RefCell::new(Vec::new())),
            Rc::new(RefCell::new(Vec::new())),
        );
        let k0 = Knobs::default().with("batch", "1");
        let (_, sub_a) = join("rest", "rest-1", &k0, log(&now));
        let (_, sub_b) = join("rest", "", &k0, log(&later));
        let (k1, k2) = (k0.with("batch", "2"), k0.with("batch", "3"));
        publish("rest", k1.clone());
        publish("rest", k2.clone());
        assert_eq!(now.borrow().as_slice(), [k1, k2.clone()]);
        assert!(later.borrow().is_empty(), "told only once the knobs rest");
        // The widget's host leaving and coming back on screen does not tell it.
        set_near("rest-1", false);
        set_near("rest-1", true);
        assert!(later.borrow().is_empty());
        set_near("", false);
        set_near("", false);
        assert_eq!(later.borrow().as_slice(), std::slice::from_ref(&k2));
        assert_eq!(now.borrow().len(), 2, "the others were told already");
        drop((sub_a, sub_b));
    }
}
