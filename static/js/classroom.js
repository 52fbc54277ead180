// Copy buttons of the class page (join code and link). No inline script (CSP).
(function () {
  "use strict";
  document.addEventListener("click", (event) => {
    const button = event.target.closest("button.copy-text");
    if (!button || !navigator.clipboard) return;
    const label = button.textContent;
    navigator.clipboard.writeText(button.dataset.copy || "").then(() => {
      button.textContent = lyceumText("copied", "Copied");
      setTimeout(() => { button.textContent = label; }, 1500);
    }, () => {});
  });
})();
