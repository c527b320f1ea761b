// mdBook's inline script: hide / unhide the sidebar before it is displayed.
let sidebar = null;
const sidebar_toggle = document.getElementById("mdbook-sidebar-toggle-anchor");
if (document.body.clientWidth >= 1080) {
    try { sidebar = localStorage.getItem('mdbook-sidebar'); } catch(e) { }
    sidebar = sidebar || 'visible';
} else {
    sidebar = 'hidden';
    sidebar_toggle.checked = false;
}
if (sidebar === 'visible') {
    sidebar_toggle.checked = true;
} else {
    html.classList.remove('sidebar-visible');
}
