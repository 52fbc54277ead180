// Attachments: the "Attach" button, drag-and-drop on the chat and paste into the box.
// Each file is uploaded at once (POST, same origin, CSRF token from the cookie); the
// server answers with the stored version's id, kept in a hidden "attachments" input
// that the composer's ws-send carries with the message. No inline script (CSP).
(function () {
  "use strict";

  const cookie = (name) => {
    const found = document.cookie.split(";").map((c) => c.trim()).find((c) => c.startsWith(name + "="));
    return found ? decodeURIComponent(found.slice(name.length + 1)) : "";
  };
  const notice = (text) => {
    const box = document.getElementById("notice");
    if (box) { box.textContent = text; box.hidden = false; }
  };

  function chip(list, data) {
    const item = document.createElement("li");
    item.className = "attached-file";
    const input = document.createElement("input");
    input.type = "hidden";
    input.name = "attachments";
    input.value = data.id;
    const label = document.createElement("span");
    label.textContent = `${data.name} (${data.size_text})`;
    const remove = document.createElement("button");
    remove.type = "button";
    remove.textContent = lyceumText("remove", "Remove");
    remove.setAttribute("aria-label", lyceumText("removeFile", "Remove %(name)s", { name: data.name }));
    remove.addEventListener("click", () => item.remove());
    item.append(input, label, remove);
    list.append(item);
  }

  async function upload(files) {
    const form = document.getElementById("composer");
    const list = document.getElementById("attached");
    if (!form || !list) return;
    for (const file of files) {
      const body = new FormData();
      body.append("file", file, file.name || "pasted");
      let response;
      try {
        response = await fetch(form.dataset.uploadUrl, {
          method: "POST", body, credentials: "same-origin",
          headers: { "X-CSRFToken": cookie("csrftoken") },
        });
      } catch (_error) {
        notice(lyceumText("couldNotUpload", "Could not upload %(name)s.", { name: file.name }));
        continue;
      }
      const data = await response.json().catch(() => ({ error: lyceumText("uploadFailed", "The upload failed.") }));
      if (!response.ok) { notice(data.error || lyceumText("uploadFailed", "The upload failed.")); continue; }
      chip(list, data);
    }
  }

  document.addEventListener("click", (event) => {
    if (event.target && event.target.id === "attach-button") {
      const input = document.getElementById("attach-input");
      if (input) input.click();
    }
  });
  document.addEventListener("change", (event) => {
    const input = event.target;
    if (input && input.id === "attach-input" && input.files && input.files.length) {
      upload(Array.from(input.files)).finally(() => { input.value = ""; });
    }
  });
  document.addEventListener("paste", (event) => {
    if (!event.target || event.target.id !== "message-input") return;
    const files = Array.from((event.clipboardData && event.clipboardData.files) || []);
    if (files.length) { event.preventDefault(); upload(files); }
  });
  document.addEventListener("dragover", (event) => {
    if (event.target.closest && event.target.closest(".chat-pane")) event.preventDefault();
  });
  document.addEventListener("drop", (event) => {
    if (!event.target.closest || !event.target.closest(".chat-pane")) return;
    const files = Array.from((event.dataTransfer && event.dataTransfer.files) || []);
    if (files.length) { event.preventDefault(); upload(files); }
  });
})();
