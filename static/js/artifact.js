// The artifact page: "Copy" copies the version's source text.
(function () {
  "use strict";
  document.addEventListener("click", (event) => {
    const button = event.target.closest && event.target.closest("button.copy-source");
    if (!button) return;
    const source = document.getElementById(button.dataset.copyTarget);
    if (!source || !navigator.clipboard) return;
    navigator.clipboard.writeText(source.value).then(() => {
      button.textContent = lyceumText("copied", "Copied");
      setTimeout(() => { button.textContent = lyceumText("copy", "Copy"); }, 1500);
    }, () => {});
  });
})();
