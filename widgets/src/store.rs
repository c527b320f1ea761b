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
