// mdBook's inline script: follow a moved heading's old fragment to its new page.
document.addEventListener('DOMContentLoaded', function() {
    const map = document.getElementById('mdbook-fragment-map');
    const fragmentMap = map ? JSON.parse(map.textContent) : {};
    const target = fragmentMap[window.location.hash];
    if (target) {
        let url = new URL(target, window.location.href);
        window.location.replace(url.href);
    }
});
