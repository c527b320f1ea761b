// mdBook's inline script on print.html: open the print dialog once the page is loaded.
window.addEventListener('load', function() {
    if (window.MathJax && MathJax.Hub) {
        MathJax.Hub.Register.StartupHook('End', function() {
            window.setTimeout(window.print, 100);
        });
    } else {
        window.setTimeout(window.print, 100);
    }
});
