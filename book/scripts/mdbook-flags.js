// mdBook's inline scripts: the playground's options.
if (document.currentScript.dataset.lineNumbers) {
    window.playground_line_numbers = true;
}
if (document.currentScript.dataset.copyable) {
    window.playground_copyable = true;
}
