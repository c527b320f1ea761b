// The book's page script (every page, with or without widgets; no inline script needed).
(function () {
    // mdBook turns the page on ← and → unless the focus is in a text field. Inside a widget
    // or a "Cite this" box those keys belong to the control that has the focus (a slider, a
    // radio group, a button): they stop here, before they reach the document.
    const keep = function (e) {
        if (e.key === 'ArrowLeft' || e.key === 'ArrowRight' || e.key === 'ArrowUp' || e.key === 'ArrowDown') {
            e.stopPropagation();
        }
    };
    const pad = function (n) { return String(n).padStart(2, '0'); };
    const today = function () {
        const d = new Date();
        return d.getFullYear() + '-' + pad(d.getMonth() + 1) + '-' + pad(d.getDate());
    };
    const start = function () {
        document.querySelectorAll('.gm-host, .gm-cite').forEach(function (el) {
            el.addEventListener('keydown', keep);
        });
        // "Cite this": the page's own address once it is open (without the widgets' state,
        // which is not part of what is cited), and the day it was read.
        document.querySelectorAll('.gm-cite[data-href]').forEach(function (box) {
            const url = new URL(box.dataset.href, location.href);
            url.search = '';
            box.querySelectorAll('.gm-cite-url').forEach(function (s) { s.textContent = url.href; });
            box.querySelectorAll('.gm-cite-date').forEach(function (s) { s.textContent = today(); });
        });
    };
    if (document.readyState === 'loading') {
        document.addEventListener('DOMContentLoaded', start);
    } else {
        start();
    }
})();
