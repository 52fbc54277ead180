// Every page: the theme (the system's, or the one chosen with the toggle) and copy
// buttons for read-only fields. Loaded in <head> so the theme applies before paint.
(function () {
  "use strict";
  const KEY = "lyceum-theme";
  const root = document.documentElement;
  const stored = () => { try { return localStorage.getItem(KEY); } catch (e) { return null; } };
  const systemDark = () => window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;
  const isDark = () => (root.dataset.theme ? root.dataset.theme === "dark" : systemDark());

  const choice = stored();
  if (choice === "dark" || choice === "light") root.dataset.theme = choice;

  function syncToggles() {
    document.querySelectorAll(".theme-toggle").forEach((button) => {
      button.setAttribute("aria-pressed", String(isDark()));
    });
  }

  document.addEventListener("click", (event) => {
    const target = event.target instanceof Element ? event.target : null;
    if (!target) return;
    if (target.closest(".theme-toggle")) {
      const next = isDark() ? "light" : "dark";
      root.dataset.theme = next;
      try { localStorage.setItem(KEY, next); } catch (e) { /* private mode: this page only */ }
      syncToggles();
      return;
    }
    const copy = target.closest(".copy-field");
    if (copy) {
      const field = document.getElementById(copy.getAttribute("aria-controls") || "");
      if (!field) return;
      const done = () => { copy.textContent = "Copied"; setTimeout(() => { copy.textContent = "Copy"; }, 1500); };
      if (navigator.clipboard) navigator.clipboard.writeText(field.value).then(done, () => {});
      else { field.select(); }
    }
  });
  // A textarea marked data-enter-sends (the home page's "Start a chat"): Enter sends.
  document.addEventListener("keydown", (event) => {
    const box = event.target;
    if (!(box instanceof HTMLTextAreaElement) || !box.hasAttribute("data-enter-sends")) return;
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      if (box.value.trim() && box.form) box.form.requestSubmit();
    }
  });
  // A form posted once: its button waits, so a double press makes one chat.
  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (form instanceof HTMLFormElement && form.id === "start-form") {
      if (form.dataset.sent) { event.preventDefault(); return; }
      form.dataset.sent = "1";
    }
  });
  if (window.matchMedia) {
    const query = window.matchMedia("(prefers-color-scheme: dark)");
    if (query.addEventListener) query.addEventListener("change", syncToggles);
  }
  document.addEventListener("DOMContentLoaded", syncToggles);
})();
