// mdBook's site root and default themes, for its scripts (book/theme/index.hbs passes them as
// data- attributes: no inline script, so the site runs under a strict Content-Security-Policy).
const path_to_root = document.currentScript.dataset.pathToRoot;
const default_light_theme = document.currentScript.dataset.defaultTheme;
const default_dark_theme = document.currentScript.dataset.darkTheme;
if (document.currentScript.dataset.searchindex) {
    window.path_to_searchindex_js = document.currentScript.dataset.searchindex;
}
