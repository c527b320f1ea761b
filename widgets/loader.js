// Loads the widgets' wasm on pages that have widgets; the bundle renders every one of them over
// its pre-rendered HTML.
import init, { near } from "./gpumem_widgets.js";

// How long the page's knobs must rest before widgets off screen are brought up to date (ms).
const REST_MS = 120;

if (document.querySelector("[data-gpumem]")) {
  // The sweep's axis, which a copied link carries (`scale=log`, written by the widget), as
  // the sweeps' own option; any other value is ignored.
  const scale = new URLSearchParams(location.search).get("scale");
  if (scale === "log" || scale === "linear") {
    for (const host of document.querySelectorAll("[data-gpumem]")) {
      try {
        const i = JSON.parse(host.dataset.gpumem);
        if (i.widget === "sweep") {
          i.options = Object.assign({}, i.options, { scale });
          host.dataset.gpumem = JSON.stringify(i);
        }
      } catch (e) {
        // A host whose JSON does not read is refused by the widgets themselves.
      }
    }
  }
  // A menu the reader has used no longer follows its options' `selected` attribute, which
  // is all a render changes (a recipe's pill sets every part's menu): the option a render
  // marks is made the one selected.
  new MutationObserver((records) => {
    for (const r of records) {
      if (r.target.tagName === "OPTION" && r.target.hasAttribute("selected")) {
        r.target.selected = true;
      }
    }
  }).observe(document.body, { subtree: true, attributes: true, attributeFilter: ["selected"] });
  // A number field whose number the engine refused goes back to the value in use, with the
  // reason beside it; that value typed again fires no change event, and the reason would
  // stay. Enter on a field as it was when it got the focus applies it anyway.
  document.addEventListener("focusin", (e) => {
    if (e.target.matches?.(".gm-num-input input")) e.target.dataset.was = e.target.value;
  });
  document.addEventListener("keydown", (e) => {
    const t = e.target;
    if (e.key === "Enter" && t.matches?.(".gm-num-input input") && t.value === t.dataset.was) {
      t.dispatchEvent(new Event("change", { bubbles: true }));
    }
  });
  // The reason a number was refused describes the field it was typed in (which shows the
  // value in use again, so it is not marked invalid) until the reason goes.
  let changed = null;
  document.addEventListener("change", (e) => {
    if (e.target.matches?.(".gm-num-input input")) changed = e.target;
  }, true);
  new MutationObserver(() => {
    const f = changed;
    if (!f) return;
    const note = f.closest("[data-gpumem]")?.querySelector(".gm-error[role=alert]");
    if (note) {
      note.id ||= `${f.id}-refused`;
      for (const o of document.querySelectorAll(`[aria-describedby="${note.id}"]`)) {
        if (o !== f) o.removeAttribute("aria-describedby");
      }
      f.setAttribute("aria-describedby", note.id);
    } else if (f.hasAttribute("aria-describedby")) {
      f.removeAttribute("aria-describedby");
    }
  }).observe(document.body, { subtree: true, childList: true });
  // A screen reader hears the widget the reader works in, not every widget a change reaches
  // (a slider's step changed six live regions on the budget page): live regions outside the
  // widget that has the focus are quiet until the focus comes to theirs.
  document.addEventListener("focusin", (e) => {
    const here = e.target.closest?.("[data-gpumem]");
    if (!here) return;
    for (const r of document.querySelectorAll("[data-gpumem] [aria-live]:not([role=alert])")) {
      r.setAttribute("aria-live", here.contains(r) ? "polite" : "off");
    }
  });
  const module_or_path = new URL("gpumem_widgets_bg.wasm", import.meta.url);
  init({ module_or_path })
    .then(() => {
      // A change reaches the widgets on screen at once; the others when they come on screen,
      // or once the changes rest: `near` tells a widget what it has missed, and where it is.
      const uid = new Map();
      for (const host of document.querySelectorAll("[data-gpumem]")) {
        try {
          uid.set(host, String(JSON.parse(host.dataset.gpumem).uid));
        } catch (e) {
          // A host whose JSON does not read is not live: nothing to tell it.
        }
      }
      const far = new Set();
      if ("IntersectionObserver" in window) {
        const seen = new IntersectionObserver((entries) => {
          for (const e of entries) {
            if (e.isIntersecting) far.delete(e.target);
            else far.add(e.target);
            near(uid.get(e.target), e.isIntersecting);
          }
        });
        for (const host of uid.keys()) seen.observe(host);
      }
      // Figures of the caching allocator's replay are computed when the book is built (the
      // wasm does not replay it): once the page's settings are not the book's (the URL carries
      // knobs), they are marked as such, and a note before the first says why.
      const built = document.querySelectorAll(".gm-built");
      let note;
      const markBuilt = () => {
        if (!built.length) return;
        const q = new URLSearchParams(location.search);
        q.delete("scale");
        const changed = [...q.keys()].length > 0;
        for (const b of built) {
          b.classList.toggle("gm-stale", changed);
          if (changed) b.title = "as the book was built, not for your settings";
          else b.removeAttribute("title");
        }
        if (changed && !note) {
          note = document.createElement("p");
          note.className = "gm-note gm-built-note";
          note.setAttribute("role", "note");
          note.textContent =
            "The underlined figures below are for this page's scenario as the book was built, " +
            "not for your settings: the allocator's replay runs when the book is built and in " +
            "the gpumem command, not in this page.";
          const at = built[0].closest("p") || built[0];
          at.parentNode.insertBefore(note, at);
        }
        if (note) note.hidden = !changed;
      };
      markBuilt();
      const catchUp = () => {
        for (const host of far) near(uid.get(host), false);
        // No widget named: the knobs have rested, and the URL is to carry them.
        near("", false);
        markBuilt();
      };
      let timer;
      document.addEventListener("gpumem:change", () => {
        clearTimeout(timer);
        timer = setTimeout(catchUp, REST_MS);
      });
      // A page printed or left at once still has every widget, and its URL, up to date.
      window.addEventListener("beforeprint", catchUp);
      window.addEventListener("pagehide", catchUp);
    })
    .catch((e) => console.error("gpumem widgets failed to start:", e));
}
