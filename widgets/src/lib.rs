//! gpumem's widgets: Yew components that show what the engine computes.
//!
//! Natively (the book build) each widget renders to HTML with Yew's server renderer, so pages
//! carry the right numbers before any script runs. In the browser the one wasm bundle finds
//! every host element (`[data-gpumem]`, whose JSON is an [`Init`]) and renders it again, in
//! its place, with the same component and the same engine: the same HTML, now live. (Rendered
//! over rather than hydrated: Yew's hydration, with the Unicode case tables only it needed,
//! cost 16 KB of the gzipped bundle.) Widgets whose scope is the page share one set of knobs
//! (see [`store`]): moving a slider in one re-evaluates them all.

use serde::Serialize;
use yew::Properties;

pub use gpumem::map::StrMap;

pub mod allocator;
pub mod breakdown;
pub mod chart;
pub mod controls;
pub mod diff;
pub mod exercise;
pub mod export;
pub mod format;
pub mod formula;
pub mod ledger;
pub mod levers;
pub mod parallelism;
pub mod parts;
pub mod precision;
pub mod quantity;
pub mod remedies;
/// Drawn when the book is built, never in the browser (it would cost the wasm a second
/// replay's code).
#[cfg(not(target_arch = "wasm32"))]
pub mod segments;
pub mod store;
pub mod sweep;
pub mod timeline;
pub mod value;
pub mod zero;

/// The wasm's allocator: talc, smaller in the bundle than Rust's default (dlmalloc). The
/// widgets run on one thread (no `atomics`).
#[cfg(all(target_family = "wasm", not(target_feature = "atomics")))]
#[global_allocator]
static ALLOCATOR: talc::wasm::WasmDynamicTalc = talc::wasm::new_wasm_dynamic_allocator();

/// How many estimates [`Knobs::estimate`] remembers (a sweep's points and the page's own).
const ESTIMATES_REMEMBERED: usize = 64;

/// The scenario's knobs (`gpumem::knobs` vocabulary): `model=llama3.1-8b`, `batch=4`, …
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Knobs(pub StrMap);

impl Knobs {
    pub fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str)
    }

    /// A knob's value, or what it means when unset ([`gpumem::knobs::default_value`]; empty
    /// for a knob without one).
    pub fn get_or_default(&self, k: &str) -> &str {
        self.get(k)
            .or_else(|| gpumem::knobs::default_value(k))
            .unwrap_or("")
    }

    /// A whole-number knob, or `default` when unset or unreadable.
    pub fn count(&self, k: &str, default: u64) -> u64 {
        self.get(k)
            .and_then(|v| gpumem::knobs::count(k, v).ok())
            .unwrap_or(default)
    }

    /// A copy with one knob set.
    pub fn with(&self, k: &str, v: impl Into<String>) -> Knobs {
        let mut n = self.clone();
        n.0.insert(k.to_string(), v.into());
        n
    }

    /// The model as a page names it: its preset, or a config (`arch`, which wins over the
    /// preset) as the engine names it.
    pub fn model_name(&self) -> &str {
        if self.get("arch").is_some() {
            "custom (config.json)"
        } else {
            self.get("model").unwrap_or(gpumem::knobs::DEFAULT_MODEL)
        }
    }

    /// A copy with one knob removed.
    pub fn without(&self, k: &str) -> Knobs {
        let mut n = self.clone();
        n.0.remove(k);
        n
    }

    pub fn scenario(&self) -> gpumem::Result<gpumem::Scenario> {
        gpumem::knobs::scenario(self.0.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    /// The engine's estimate for these knobs, the caching allocator not replayed. The last
    /// few are remembered: a page's widgets
    /// (a bar, a timeline, a breakdown, formulas and values, each its own app) ask for the same
    /// scenario, and a sweep asks again for its points when it is redrawn.
    pub fn estimate(&self) -> gpumem::Result<gpumem::Estimate> {
        thread_local! {
            static RECENT: std::cell::RefCell<Vec<(Knobs, gpumem::Result<gpumem::Estimate>)>> =
                const { std::cell::RefCell::new(Vec::new()) };
        }
        if let Some(hit) = RECENT.with(|r| {
            r.borrow()
                .iter()
                .find(|(k, _)| k == self)
                .map(|(_, e)| e.clone())
        }) {
            return hit;
        }
        // The caching allocator is not replayed here, in the book's build as in the browser
        // (whose wasm does not carry the replay): a widget shows the same figures before and
        // once it is live. The book's replayed figures are drawn at build time instead
        // (`segments`, and the `value`s of reserved memory).
        let e = self.scenario().and_then(|mut s| {
            s.allocator.replay = false;
            gpumem::estimate(&s)
        });
        RECENT.with(|r| {
            let mut r = r.borrow_mut();
            if r.len() >= ESTIMATES_REMEMBERED {
                let _ = r.remove(0);
            }
            r.push((self.clone(), e.clone()));
        });
        e
    }
}

impl Knobs {
    /// The engine's op-level timeline for these knobs (the last few remembered: a chapter
    /// may show it twice, and a slider comes back to where it was).
    pub fn timeline(&self) -> std::rc::Rc<gpumem::Result<gpumem::timeline::OpTimeline>> {
        type Memo = Vec<(
            Knobs,
            std::rc::Rc<gpumem::Result<gpumem::timeline::OpTimeline>>,
        )>;
        thread_local! {
            static RECENT: std::cell::RefCell<Memo> = const { std::cell::RefCell::new(Vec::new()) };
        }
        if let Some(hit) = RECENT.with(|r| {
            r.borrow()
                .iter()
                .find(|(k, _)| k == self)
                .map(|(_, t)| t.clone())
        }) {
            return hit;
        }
        let t = std::rc::Rc::new(
            self.scenario()
                .and_then(|s| gpumem::timeline::op_timeline(&s)),
        );
        RECENT.with(|r| {
            let mut r = r.borrow_mut();
            if r.len() >= 4 {
                let _ = r.remove(0);
            }
            r.push((self.clone(), t.clone()));
        });
        t
    }

    /// These knobs with changes written `key=value key=value` (a widget's `with` option)
    /// applied in order; a change that is not `key=value` or names no knob is an error.
    pub fn with_changes(&self, changes: &str) -> Result<Knobs, String> {
        let mut k = self.clone();
        for c in changes.split_whitespace() {
            let (key, v) = c
                .split_once('=')
                .ok_or_else(|| format!("'{}' is not key=value", gpumem::knobs::shown(c)))?;
            if !gpumem::knobs::KNOBS.contains(&key) {
                return Err(format!("'{}' is not a knob", gpumem::knobs::shown(key)));
            }
            k = k.with(key, v);
        }
        Ok(k)
    }
}

/// What a widget starts from: written by the book build into the host element, read back by
/// the wasm when it renders the widget live.
#[derive(Clone, Debug, PartialEq, Serialize, Properties)]
pub struct Init {
    /// The widget's name (`allocator`, …).
    pub widget: String,
    /// An id unique on the page, print.html included; element ids inside the widget derive
    /// from it.
    pub uid: String,
    /// The chapter the widget belongs to: its page-scoped state is that chapter's (print.html
    /// holds every chapter).
    pub page: String,
    /// The scenario the widget shows first.
    pub knobs: Knobs,
    /// The widget's own attributes (`show-breakdown=false`, `seq-max=128k`, …).
    pub options: StrMap,
    /// `scope=local`: the widget keeps its own knobs instead of the page's.
    pub local: bool,
}

impl Init {
    /// The id of an element inside the widget: the widget's own, then what it is.
    pub fn id(&self, what: &str) -> String {
        format!("{}-{what}", self.uid)
    }

    /// Read back what [`host_html`] wrote. By hand rather than by a serde derive: the derive's
    /// error paths would bring float formatting into the wasm.
    pub fn from_json(text: &str) -> Result<Init, String> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| gpumem::error::json_fault(&e))?;
        let o = v.as_object().ok_or("must be a JSON object")?;
        let text = |k: &str| {
            o.get(k)
                .and_then(|v| v.as_str())
                .map(str::to_string)
                .ok_or(format!("{k}: a string is required"))
        };
        let map = |k: &str| match o.get(k) {
            None => Ok(StrMap::default()),
            Some(v) => StrMap::from_json(v).ok_or(format!("{k}: must map names to strings")),
        };
        Ok(Init {
            widget: text("widget")?,
            uid: text("uid")?,
            page: match o.get("page") {
                None => String::new(),
                Some(v) => v.as_str().ok_or("page: must be a string")?.to_string(),
            },
            knobs: Knobs(map("knobs")?),
            options: map("options")?,
            local: match o.get("local") {
                None => false,
                Some(v) => v.as_bool().ok_or("local: must be true or false")?,
            },
        })
    }

    pub fn option(&self, k: &str) -> Option<&str> {
        self.options.get(k).map(String::as_str)
    }
}

/// The widgets that render today.
pub const RENDERED: &[&str] = &[
    "allocator",
    "breakdown",
    "timeline",
    "sweep",
    "value",
    "formula",
    "zero",
    "precision",
    "parallelism",
    "diff",
    "exercise",
    "ledger",
    "remedies",
    "segments",
];

/// Widgets that sit inside a sentence (their host is a `span`).
pub const INLINE: &[&str] = &["value"];

/// The attribute of a host element that carries its [`Init`] as JSON.
pub const HOST_ATTR: &str = "data-gpumem";

/// Every widget is this one component: the widget `init` names, its hooks run as hooks of
/// this component (a host's widget never changes, so each host runs the same hooks in the
/// same order at every render). One component type instead of one per widget keeps Yew's
/// per-component code (creation, mounting, scheduling) in the wasm once.
#[yew::component]
pub fn Widget(init: &Init) -> yew::Html {
    use_widget(init)
}

/// The widget `init` names, run as a hook of [`Widget`].
fn use_widget(init: &Init) -> WidgetHook<'_> {
    WidgetHook(init)
}

struct WidgetHook<'a>(&'a Init);

impl yew::functional::Hook for WidgetHook<'_> {
    type Output = yew::Html;

    fn run(self, ctx: &mut yew::functional::HookContext) -> yew::Html {
        let i = self.0;
        match i.widget.as_str() {
            "allocator" => allocator::use_allocator(i).run(ctx),
            "breakdown" => breakdown::use_breakdown(i).run(ctx),
            "timeline" => timeline::use_timeline(i).run(ctx),
            "sweep" => sweep::use_sweep(i).run(ctx),
            "value" => value::use_value(i).run(ctx),
            "formula" => formula::use_formula(i).run(ctx),
            "zero" => zero::use_zero(i).run(ctx),
            "precision" => precision::use_precision(i).run(ctx),
            "parallelism" => parallelism::use_parallelism(i).run(ctx),
            "diff" => diff::use_diff(i).run(ctx),
            "exercise" => exercise::use_exercise(i).run(ctx),
            "ledger" => ledger::use_ledger(i).run(ctx),
            "remedies" => remedies::use_remedies(i).run(ctx),
            _ => yew::Html::default(),
        }
    }
}

/// Render a widget to HTML (the book build). In the browser the same component renders it
/// again, over it.
#[cfg(not(target_arch = "wasm32"))]
pub fn render(init: &Init) -> Result<String, String> {
    if !RENDERED.contains(&init.widget.as_str()) {
        return Err(format!(
            "the {} widget is not built yet (built: {})",
            init.widget,
            RENDERED.join(", ")
        ));
    }
    // The segments are drawn at build time only, with the allocator replayed: a component
    // of their own, natively.
    if init.widget == "segments" {
        return Ok(futures::executor::block_on(
            yew::LocalServerRenderer::<segments::Segments>::with_props(init.clone())
                .hydratable(false)
                .render(),
        ));
    }
    Ok(futures::executor::block_on(
        yew::LocalServerRenderer::<Widget>::with_props(init.clone())
            .hydratable(false)
            .render(),
    ))
}

/// The host element the book build writes: the widget's pre-rendered HTML inside an element
/// that carries its [`Init`]. One line, so markdown keeps it as one HTML block.
#[cfg(not(target_arch = "wasm32"))]
pub fn host_html(init: &Init) -> Result<String, String> {
    let inner = disabled(&render(init)?);
    let json = serde_json::to_string(init).map_err(|e| e.to_string())?;
    let tag = if INLINE.contains(&init.widget.as_str()) {
        "span"
    } else {
        "div"
    };
    Ok(format!(
        "<{tag} class=\"gm-host\" {HOST_ATTR}=\"{}\">{}</{tag}>",
        format::escape_attr(&json),
        inner
    ))
}

/// `html` with its form controls disabled: what the book carries is read without JavaScript,
/// where nothing would answer a control (a slider moved by the keyboard changed no figure);
/// the widgets render live controls over it.
#[cfg(not(target_arch = "wasm32"))]
fn disabled(html: &str) -> String {
    let mut out = String::with_capacity(html.len() + 256);
    let mut rest = html;
    while let Some(i) = rest.find('<') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        let tag = ["<input", "<select", "<button", "<textarea"]
            .into_iter()
            .find(|t| {
                rest.starts_with(t) && matches!(rest.as_bytes().get(t.len()), Some(b' ' | b'>'))
            });
        match tag {
            Some(t) => {
                out.push_str(t);
                out.push_str(" disabled");
                rest = &rest[t.len()..];
            }
            None => {
                out.push('<');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The browser entry point: render every widget host on the page over its pre-rendered HTML
/// (Yew empties the host and renders into it within the same task: nothing is painted in
/// between).
/// The page's script (loader.js) says where a widget's host is: near the screen or not
/// ([`store::set_near`]); no widget named (`""`), that the knobs have rested: the URL is to
/// carry them now ([`store::url::flush`]), and the parts of widgets that wait for the knobs
/// to rest are told.
#[cfg(target_arch = "wasm32")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn near(uid: &str, near: bool) {
    if uid.is_empty() {
        store::url::flush();
    }
    store::set_near(uid, near);
}

#[cfg(target_arch = "wasm32")]
#[wasm_bindgen::prelude::wasm_bindgen(start)]
pub fn start() {
    let Some(doc) = web_sys::window().and_then(|w| w.document()) else {
        return;
    };
    let Ok(hosts) = doc.query_selector_all(&format!("[{HOST_ATTR}]")) else {
        return;
    };
    store::page_events::listen();
    // Each host's JSON is read once; a host whose JSON does not read stays as rendered.
    let widgets: Vec<(web_sys::Element, Init)> = (0..hosts.length())
        .filter_map(|i| hosts.item(i))
        .filter_map(|n| wasm_bindgen::JsCast::dyn_into::<web_sys::Element>(n).ok())
        .filter_map(|el| {
            let init = Init::from_json(&el.get_attribute(HOST_ATTR)?).ok()?;
            Some((el, init))
        })
        .collect();
    // A chapter's defaults are its first page-scoped widget's knobs. On a page that is one
    // chapter the URL may override them; print.html (every chapter) keeps each chapter's own.
    let mut chapters: Vec<&str> = Vec::new();
    for (_, i) in widgets.iter().filter(|(_, i)| !i.local) {
        if !chapters.contains(&i.page.as_str()) {
            chapters.push(&i.page);
        }
    }
    store::set_chapters(chapters.len());
    if let (1, Some((_, d))) = (chapters.len(), widgets.iter().find(|(_, i)| !i.local)) {
        store::url::read(&d.page, &d.knobs);
    }
    for (el, init) in widgets {
        // (The segments are drawn at build time: the browser keeps them as drawn.)
        if RENDERED.contains(&init.widget.as_str()) && init.widget != "segments" {
            yew::Renderer::<Widget>::with_root_and_props(el, init).render();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The book's pre-rendered controls are disabled: without JavaScript a slider moved by
    /// the keyboard changed no figure.
    #[test]
    fn pre_rendered_controls_are_disabled() {
        assert_eq!(
            disabled(
                r#"<p><input type="range"><button>Go</button><buttons><select id="a"></select></p>"#
            ),
            r#"<p><input disabled type="range"><button disabled>Go</button><buttons><select disabled id="a"></select></p>"#
        );
        let init = Init::from_json(r#"{"widget":"allocator","uid":"w1","page":"budget"}"#).unwrap();
        let html = host_html(&init).unwrap();
        let controls = html.matches("<input").count() + html.matches("<button").count();
        assert!(controls > 0);
        assert_eq!(
            html.matches(" disabled").count(),
            controls + html.matches("<select").count()
        );
    }

    #[test]
    fn init_reads_back_what_the_book_writes() {
        let init = Init {
            widget: "sweep".into(),
            uid: "w3".into(),
            page: "budget".into(),
            knobs: Knobs(
                [("model", "llama3.1-8b"), ("seq", "8k")]
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            options: [("over".to_string(), "seq".to_string())]
                .into_iter()
                .collect(),
            local: true,
        };
        let json = serde_json::to_string(&init).unwrap();
        assert_eq!(Init::from_json(&json), Ok(init));
        // Defaults, as the book omits nothing but a hand-written host may.
        let bare = Init::from_json(r#"{"widget":"value","uid":"v1"}"#).unwrap();
        assert!(bare.knobs.0.is_empty() && bare.options.is_empty() && !bare.local);
        assert_eq!(bare.page, "");
        for (bad, why) in [
            ("[]", "must be a JSON object"),
            (r#"{"uid":"v1"}"#, "widget: a string is required"),
            (
                r#"{"widget":"value","uid":"v1","knobs":{"seq":4}}"#,
                "knobs: must map",
            ),
            (
                r#"{"widget":"value","uid":"v1","local":"yes"}"#,
                "local: must be true",
            ),
        ] {
            let e = Init::from_json(bad).unwrap_err();
            assert!(e.starts_with(why), "{bad}: {e}");
        }
    }
}
