// Every page: the theme (the system's, or the one chosen with the toggle) and copy
// buttons for read-only fields. Loaded in <head> so the theme applies before paint.
(function () {
  "use strict";
  // The page's texts in its language (base.html renders them as #lyceum-texts, JSON):
  // lyceumText("copy", "Copy"), with %(name)s filled from the values given.
  let texts = null;
  window.lyceumText = function (key, fallback, values) {
    if (texts === null) {
      const block = document.getElementById("lyceum-texts");
      try { texts = block ? JSON.parse(block.textContent) : {}; } catch (e) { texts = {}; }
    }
    let text = texts[key] || fallback;
    Object.entries(values || {}).forEach(([name, value]) => {
      text = text.split(`%(${name})s`).join(String(value));
    });
    return text;
  };
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
      const done = () => {
        copy.textContent = lyceumText("copied", "Copied");
        setTimeout(() => { copy.textContent = lyceumText("copy", "Copy"); }, 1500);
      };
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
  // The language picker switches as soon as a language is chosen (its button is for no-JS).
  document.addEventListener("change", (event) => {
    const select = event.target;
    if (select instanceof HTMLSelectElement && select.id === "language-select" && select.form) {
      select.form.requestSubmit();
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
