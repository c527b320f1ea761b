// Loads the widgets' wasm on pages that have widgets; the bundle renders every one of them over
// its pre-rendered HTML.
import init from "./gpumem_widgets.js";

if (document.querySelector("[data-gpumem]")) {
  const module_or_path = new URL("gpumem_widgets_bg.wasm", import.meta.url);
  init({ module_or_path }).catch((e) => console.error("gpumem widgets failed to start:", e));
}
