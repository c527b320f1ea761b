//! The page's shared knobs: one scenario that every page-scoped widget reads and writes, like
//! the cells of a notebook. Each hydrated widget is its own Yew app, so the store lives outside
//! Yew: widgets subscribe when they mount and publish when a reader moves a control.

use std::cell::RefCell;

use yew::Callback;

use crate::Knobs;

#[derive(Default)]
struct Store {
    knobs: Option<Knobs>,
    subscribers: Vec<(usize, Callback<Knobs>)>,
    next_id: usize,
}

thread_local! {
    static STORE: RefCell<Store> = RefCell::new(Store::default());
}

/// A subscription; dropping it unsubscribes.
pub struct Subscription(usize);

impl Drop for Subscription {
    fn drop(&mut self) {
        STORE.with(|s| s.borrow_mut().subscribers.retain(|(id, _)| *id != self.0));
    }
}

/// Join the page: the first widget's knobs become the page's. Returns the page's knobs now.
pub fn join(initial: &Knobs, on_change: Callback<Knobs>) -> (Knobs, Subscription) {
    STORE.with(|s| {
        let mut s = s.borrow_mut();
        let current = s.knobs.get_or_insert_with(|| initial.clone()).clone();
        let id = s.next_id;
        s.next_id += 1;
        s.subscribers.push((id, on_change));
        (current, Subscription(id))
    })
}

/// Set the page's knobs and tell every subscriber.
pub fn publish(knobs: Knobs) {
    // Collect first: a subscriber may (un)subscribe while it is told.
    let subscribers: Vec<Callback<Knobs>> = STORE.with(|s| {
        let mut s = s.borrow_mut();
        s.knobs = Some(knobs.clone());
        s.subscribers.iter().map(|(_, c)| c.clone()).collect()
    });
    for c in subscribers {
        c.emit(knobs.clone());
    }
    #[cfg(target_arch = "wasm32")]
    page_events::changed(&knobs);
}

/// The page's knobs as DOM events, for readers' own scripts: every change is announced as
/// `gpumem:change` on `document` (detail: the knobs), and a `gpumem:set` event whose detail
/// is an object of knobs changes them. What `gpumem:set` carries is data: each knob is
/// checked by the engine, and an invalid set is refused with a console warning, the page's
/// knobs unchanged.
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
            let text = js_sys::JSON::stringify(&ce.detail())
                .ok()
                .and_then(|s| s.as_string())
                .unwrap_or_default();
            match apply(&text) {
                Ok(k) => super::publish(k),
                Err(msg) => web_sys::console::warn_1(&format!("gpumem:set refused: {msg}").into()),
            }
        });
        let _ = doc.add_event_listener_with_callback("gpumem:set", on_set.as_ref().unchecked_ref());
        on_set.forget();
    }

    /// The page's knobs with `text` (a JSON object of knob → value) applied, if valid.
    fn apply(text: &str) -> Result<Knobs, String> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let obj = v.as_object().ok_or("detail must be an object of knobs")?;
        let mut k = super::current().unwrap_or_default();
        for (key, val) in obj {
            let s = match val {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) => n.to_string(),
                _ => return Err(format!("{key}: must be a string or a number")),
            };
            k = k.with(key, s);
        }
        k.scenario().map_err(|e| e.to_string())?;
        Ok(k)
    }
}

/// The page's knobs, once a widget has joined.
pub fn current() -> Option<Knobs> {
    STORE.with(|s| s.borrow().knobs.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn first_joiner_sets_the_page_and_publish_reaches_everyone() {
        let seen = Rc::new(RefCell::new(Vec::new()));
        let a = Knobs::default().with("batch", "2");
        let b = Knobs::default().with("batch", "8");
        let log = seen.clone();
        let (got_a, sub_a) = join(&a, Callback::from(move |k: Knobs| log.borrow_mut().push(k)));
        let (got_b, sub_b) = join(&b, Callback::from(|_| {}));
        assert_eq!(got_a, a);
        assert_eq!(got_b, a, "the page's knobs win over a later widget's");
        publish(b.clone());
        assert_eq!(seen.borrow().as_slice(), std::slice::from_ref(&b));
        drop(sub_a);
        publish(a.clone());
        assert_eq!(seen.borrow().len(), 1, "unsubscribed on drop");
        drop(sub_b);
    }
}
