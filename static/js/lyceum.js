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

  function copyButton(label, className, text) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = className;
    button.textContent = lyceumText("copy", "Copy");
    button.setAttribute("aria-label", label);
    button.addEventListener("click", () => {
      const done = () => {
        button.textContent = lyceumText("copied", "Copied");
        setTimeout(() => { button.textContent = lyceumText("copy", "Copy"); }, 1500);
      };
      if (navigator.clipboard) navigator.clipboard.writeText(text()).then(done, () => {});
    });
    return button;
  }

  function addCopyButtons(root) {
    // Each code block: its language and a copy button above it.
    (root || document).querySelectorAll("pre.highlight").forEach((pre) => {
      if (pre.dataset.copy) return;
      pre.dataset.copy = "1";
      const head = document.createElement("div");
      head.className = "code-head";
      const lang = pre.dataset.lang || "";
      if (lang && lang !== "text") {
        const label = document.createElement("span");
        label.className = "code-lang";
        label.textContent = lang;
        head.appendChild(label);
      }
      head.appendChild(copyButton(lyceumText("copyCode", "Copy code"), "copy-code", () =>
        pre.querySelector("code") ? pre.querySelector("code").innerText : pre.innerText));
      pre.parentNode.insertBefore(head, pre);
    });
    // Each written message (not the one being streamed): copy its text.
    (root || document).querySelectorAll("#messages .msg.user, #messages .msg.assistant").forEach((msg) => {
      const bubble = msg.querySelector(":scope > .bubble");
      if (!bubble || msg.dataset.copy) return;
      msg.dataset.copy = "1";
      const actions = document.createElement("div");
      actions.className = "msg-actions";
      actions.appendChild(copyButton(lyceumText("copyMessage", "Copy message"), "copy-message", () => bubble.innerText.trim()));
      bubble.after(actions);
    });
  }

  // --- Connection state (issue 15 §3) -------------------------------------------------
  // Reconnect soon after the server is back: 0.25 s, 0.5 s, 1 s, then every 1.5 s.
  const RECONNECT_MS = [250, 500, 1000, 1500];
  const reconnectDelay = (retry) => RECONNECT_MS[Math.min(retry, RECONNECT_MS.length - 1)];
  if (window.htmx) htmx.config.wsReconnectDelay = reconnectDelay;
  // The extension reconnects by itself after these codes; after others we do it.
  const EXTENSION_RETRIES = [1006, 1011, 1012, 1013];
  // The server refused this page (logged out, no access, no such chat): do not retry.
  const REFUSED = [4401, 4403, 4404];
  let unloading = false;
  let ownRetries = 0;
  window.addEventListener("pagehide", () => { unloading = true; });

  const connection = () => document.getElementById("connection-state");
  function showConnection(text) {
    const box = connection();
    if (!box) return;
    box.textContent = text;
    box.hidden = !text;
  }
  const pendingSend = () => {
    const form = document.getElementById("composer");
    return form && form.dataset.pending === "1";
  };
  function markOffline() {
    document.body.dataset.ws = "closed";
    showConnection(pendingSend()
      ? lyceumText("reconnectingPending", "Reconnecting… Your message is kept and goes out when the connection is back.")
      : lyceumText("reconnecting", "Reconnecting… What you type is kept; a message sent now goes out when the connection is back."));
  }

  // The socket opened (or reopened): tell the server where this page is.
  document.addEventListener("htmx:wsOpen", (event) => {
    document.body.dataset.ws = "open";
    ownRetries = 0;
    showConnection("");
    event.detail.socketWrapper.send(JSON.stringify({ action: "resync", last_seq: lastSeq() }));
  });
  document.addEventListener("htmx:wsClose", (event) => {
    if (unloading) return;
    const code = event.detail.event ? event.detail.event.code : 1006;
    if (REFUSED.includes(code)) {
      document.body.dataset.ws = "closed";
      showConnection(lyceumText("refused", "Disconnected: this chat is no longer available to you. Reload the page."));
      return;
    }
    markOffline();
    if (!EXTENSION_RETRIES.includes(code)) {
      const wrapper = event.detail.socketWrapper;
      setTimeout(() => { if (document.body.dataset.ws !== "open") wrapper.reconnect(); },
        reconnectDelay(ownRetries++));
    }
  });
  document.addEventListener("htmx:wsError", () => { if (document.body.dataset.ws !== "open") markOffline(); });

  // One id per message typed, so a double click or a resend stores it once.
  document.addEventListener("htmx:wsConfigSend", (event) => {
    const form = event.detail.elt;
    // An edit is a message too: one id per edit form, so a double click sends it once.
    if (form && form.classList && form.classList.contains("edit-form")) {
      if (!form.dataset.clientId) form.dataset.clientId = newId();
      event.detail.parameters.client_id = form.dataset.clientId;
    }
    if (form && form.id === "composer") {
      const text = (event.detail.parameters.message || "").trim();
      if (!text) { event.preventDefault(); return; }
      if (!clientId) clientId = newId();
      event.detail.parameters.client_id = clientId;
      form.dataset.pending = "1";
      follow = true;
      toBottom();
      updateJump();
      if (document.body.dataset.ws !== "open") markOffline();  // queued by the extension
    }
  });

  let follow = true;
  document.addEventListener("htmx:wsBeforeMessage", () => { follow = follow || nearBottom(); });
  document.addEventListener("htmx:wsAfterMessage", () => {
    addCopyButtons();
    if (follow) toBottom();
    follow = false;
    updateJump();
  });

  // "Jump to latest" while scrolled up; sending scrolls down.
  function updateJump() {
    const jump = document.getElementById("jump-latest");
    if (jump) jump.hidden = nearBottom();
  }
  document.addEventListener("scroll", (event) => {
    if (event.target && event.target.id === "scroller") updateJump();
  }, true);
  document.addEventListener("click", (event) => {
    if (event.target instanceof Element && event.target.closest("#jump-latest")) {
      toBottom();
      updateJump();
      const box = document.getElementById("message-input");
      if (box) box.focus();
    }
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
    } else if (event.key === "Escape" && !event.isComposing) {
      // In a text field Esc cancels that field (an edit, a rename, a reason), never the run.
      // An empty message box has nothing to cancel: there Esc stops the reply, as elsewhere.
      const field = box && box.closest && box.closest("input, textarea, select");
      if (field && !(field.id === "message-input" && !field.value)) {
        const fold = field.closest("details[open]");
        if (field.id !== "message-input" && "defaultValue" in field) field.value = field.defaultValue;
        if (fold) {
          fold.open = false;
          const summary = fold.querySelector("summary");
          if (summary) summary.focus();
        } else {
          field.blur();
        }
        event.preventDefault();
        return;
      }
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
    // A search hit links to its message (#ev-<seq>): show it, not the newest.
    const target = location.hash.startsWith("#ev-") && document.getElementById(location.hash.slice(1));
    if (target) {
      target.classList.add("target");
      target.scrollIntoView({ block: "center" });
      follow = false;
    } else {
      toBottom();
    }
    updateJump();
    const box = document.getElementById("message-input");
    if (box && !box.closest(".view-only")) box.focus({ preventScroll: true });
  });
  document.addEventListener("htmx:afterSwap", () => addCopyButtons());
})();
