// mdBook's inline script: live reload when served by `mdbook serve`.
(function () {
    const endpoint = document.currentScript.dataset.endpoint;
    const wsProtocol = location.protocol === 'https:' ? 'wss:' : 'ws:';
    const wsAddress = wsProtocol + "//" + location.host + "/" + endpoint;
    const socket = new WebSocket(wsAddress);
    socket.onmessage = function (event) {
        if (event.data === "reload") {
            socket.close();
            location.reload();
        }
    };
    window.onbeforeunload = function() {
        socket.close();
    };
})();
