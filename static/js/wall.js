// The teacher's wall: resync every tile, sort, filter flagged, unread counts, reset forms.
// No inline script (CSP).
(function () {
  "use strict";
  const wall = () => document.getElementById("wall");
  const MAX_ITEMS = 200;

  function seqs() {
    const out = {};
    document.querySelectorAll(".tile-seq").forEach((marker) => {
      out[marker.id.replace("tile-seq-", "")] = parseInt(marker.dataset.seq || "0", 10);
    });
    return out;
  }

  document.addEventListener("htmx:wsClose", () => { document.body.dataset.ws = "closed"; });
  document.addEventListener("htmx:wsOpen", (event) => {
    document.body.dataset.ws = "open";
    event.detail.socketWrapper.send(JSON.stringify({ action: "resync", seqs: seqs() }));
  });

  document.addEventListener("htmx:wsAfterSend", (event) => {
    const form = event.target.closest ? event.target.closest("form") : null;
    if (form && form.querySelector("input[name=message]")) form.reset();
  });

  function tidy() {
    const root = wall();
    if (!root) return;
    const focused = root.classList.contains("focused");
    root.querySelectorAll(".tile").forEach((tile) => {
      const list = tile.querySelector(".tile-msgs");
      if (list && !focused) {
        while (list.children.length > MAX_ITEMS) list.firstElementChild.remove();
      }
      const read = parseInt(tile.dataset.readSeq || "-1", 10);
      if (read < 0) { tile.dataset.readSeq = String(lastSeq(tile)); return; }
      const unread = tile.querySelectorAll(".tile-item.student").length === 0 ? 0 :
        Array.from(tile.querySelectorAll(".tile-item.student"))
          .filter((li) => parseInt(li.dataset.seq, 10) > read).length;
      const badge = tile.querySelector(".unread");
      if (badge) { badge.textContent = lyceumText("unreadNew", "%(count)s new", { count: unread }); badge.hidden = unread === 0; }
      tile.classList.toggle("flagged", !!tile.querySelector(".flag"));
    });
    arrange();
  }

  function lastSeq(tile) {
    const marker = tile.querySelector(".tile-seq");
    return marker ? parseInt(marker.dataset.seq || "0", 10) : 0;
  }

  function arrange() {
    const root = wall();
    const sort = document.getElementById("wall-sort");
    const onlyFlagged = document.getElementById("wall-flagged");
    if (!root || !sort) return;
    const tiles = Array.from(root.querySelectorAll(".tile"));
    const activity = (t) => { const time = t.querySelector(".tile-activity"); return time ? time.getAttribute("datetime") || "" : ""; };
    tiles.sort((a, b) => sort.value === "name"
      ? a.dataset.name.localeCompare(b.dataset.name)
      : activity(b).localeCompare(activity(a)) || a.dataset.name.localeCompare(b.dataset.name));
    tiles.forEach((tile, index) => {
      if (root.children[index] !== tile) root.appendChild(tile);
      tile.hidden = onlyFlagged && onlyFlagged.checked && !tile.querySelector(".flag");
    });
  }

  document.addEventListener("click", (event) => {
    const tile = event.target.closest ? event.target.closest(".tile") : null;
    if (tile) { tile.dataset.readSeq = String(lastSeq(tile)); tidy(); }
  });
  document.addEventListener("change", (event) => {
    if (event.target.id === "wall-sort" || event.target.id === "wall-flagged") arrange();
  });
  document.addEventListener("htmx:wsAfterMessage", tidy);
  document.addEventListener("DOMContentLoaded", tidy);
})();
