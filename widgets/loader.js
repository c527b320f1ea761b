// Loads the widgets' wasm on pages that have widgets; the bundle hydrates every one of them.
import init from "./gpumem_widgets.js";

if (document.querySelector("[data-gpumem]")) {
  init().catch((e) => console.error("gpumem widgets failed to start:", e));
}
