// mdBook's inline script: ARIA attributes once the sidebar and its toggle are in the DOM.
document.getElementById('mdbook-sidebar-toggle').setAttribute('aria-expanded', sidebar === 'visible');
document.getElementById('mdbook-sidebar').setAttribute('aria-hidden', sidebar !== 'visible');
Array.from(document.querySelectorAll('#mdbook-sidebar a')).forEach(function(link) {
    link.setAttribute('tabIndex', sidebar === 'visible' ? 0 : -1);
});
