// mdBook's inline scripts, moved here unchanged in what they do (book/theme/index.hbs).
// Work around some values being stored in localStorage wrapped in quotes.
try {
    let theme = localStorage.getItem('mdbook-theme');
    let sidebar = localStorage.getItem('mdbook-sidebar');

    if (theme.startsWith('"') && theme.endsWith('"')) {
        localStorage.setItem('mdbook-theme', theme.slice(1, theme.length - 1));
    }

    if (sidebar.startsWith('"') && sidebar.endsWith('"')) {
        localStorage.setItem('mdbook-sidebar', sidebar.slice(1, sidebar.length - 1));
    }
} catch (e) { }

// Set the theme before any content is loaded, prevents flash.
const default_theme = window.matchMedia("(prefers-color-scheme: dark)").matches ? default_dark_theme : default_light_theme;
let theme;
try { theme = localStorage.getItem('mdbook-theme'); } catch(e) { }
if (theme === null || theme === undefined) { theme = default_theme; }
const html = document.documentElement;
html.classList.remove(default_light_theme);
html.classList.add(theme);
html.classList.add("js");
