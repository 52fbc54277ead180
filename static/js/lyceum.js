// Lyceum's own script: resync cursor, composer keys and ids, scroll-follow, copy buttons.
// Everything else is htmx and its ws extension. No inline script anywhere (CSP).
(function () {
  "use strict";

  let clientId = null;
  const newId = () =>
    (window.crypto && crypto.randomUUID) ? crypto.randomUUID()
      : Date.now().toString(36) + Math.random().toString(36).slice(2);

  const lastSeq = () => {
    const marker = document.getElementById("seq-marker");
    return marker ? parseInt(marker.dataset.seq || "0", 10) : 0;
  };
  const scroller = () => document.getElementById("scroller");
  const nearBottom = () => {
    const s = scroller();
    return !s || s.scrollHeight - s.scrollTop - s.clientHeight < 120;
  };
  const toBottom = () => { const s = scroller(); if (s) s.scrollTop = s.scrollHeight; };

  function addCopyButtons(root) {
    (root || document).querySelectorAll("pre.highlight").forEach((pre) => {
      if (pre.dataset.copy) return;
      pre.dataset.copy = "1";
      const button = document.createElement("button");
      button.type = "button";
      button.className = "copy-code";
      button.textContent = "Copy";
      button.setAttribute("aria-label", "Copy code");
      button.addEventListener("click", () => {
        const text = pre.querySelector("code") ? pre.querySelector("code").innerText : pre.innerText;
        const done = () => { button.textContent = "Copied"; setTimeout(() => { button.textContent = "Copy"; }, 1500); };
        if (navigator.clipboard) navigator.clipboard.writeText(text).then(done, () => {});
      });
      pre.parentNode.insertBefore(button, pre);
    });
  }

  // The socket opened (or reopened): tell the server where this page is.
  document.addEventListener("htmx:wsOpen", (event) => {
    document.body.dataset.ws = "open";
    event.detail.socketWrapper.send(JSON.stringify({ action: "resync", last_seq: lastSeq() }));
  });
  document.addEventListener("htmx:wsClose", () => { document.body.dataset.ws = "closed"; });

  // One id per message typed, so a double click or a resend stores it once.
  document.addEventListener("htmx:wsConfigSend", (event) => {
    const form = event.detail.elt;
    if (form && form.id === "composer") {
      const text = (event.detail.parameters.message || "").trim();
      if (!text) { event.preventDefault(); return; }
      if (!clientId) clientId = newId();
      event.detail.parameters.client_id = clientId;
    }
  });

  let follow = true;
  document.addEventListener("htmx:wsBeforeMessage", () => { follow = nearBottom(); });
  document.addEventListener("htmx:wsAfterMessage", () => {
    addCopyButtons();
    if (follow) toBottom();
  });
  document.addEventListener("htmx:oobAfterSwap", (event) => {
    const target = event.detail.target;
    if (target && target.id === "composer") {
      clientId = null;  // the server took the message: the next one is new
      const box = document.getElementById("message-input");
      if (box) box.focus();
    }
  });

  document.addEventListener("keydown", (event) => {
    const box = event.target;
    if (box && box.id === "message-input" && event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      if (box.value.trim()) box.form.requestSubmit();
    } else if (event.key === "Escape") {
      const stop = document.getElementById("stop-button");
      if (stop) stop.click();
    }
  });
  document.addEventListener("input", (event) => {
    if (event.target && event.target.id === "message-input" && !event.target.value) clientId = null;
  });

  // Phones: the chat list slides out from a chat ("Chats") and back.
  function setChatList(open) {
    document.body.classList.toggle("chat-list-open", open);
    document.querySelectorAll(".chat-list-toggle").forEach((b) => b.setAttribute("aria-expanded", String(open)));
    if (open) {
      const first = document.querySelector("#sidebar a, #sidebar input, #sidebar select");
      if (first) first.focus();
    }
  }
  document.addEventListener("click", (event) => {
    const target = event.target;
    if (!(target instanceof Element)) return;
    if (target.closest(".chat-list-toggle")) setChatList(!document.body.classList.contains("chat-list-open"));
    else if (target.closest(".chat-list-close") || target.closest(".chat-list-backdrop")) setChatList(false);
  });

  document.addEventListener("DOMContentLoaded", () => {
    addCopyButtons();
    toBottom();
  });
  document.addEventListener("htmx:afterSwap", () => addCopyButtons());
})();
