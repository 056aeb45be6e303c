// effect-ledger console: optional auto-refresh of the read-only pages, nothing else. The pages work
// without JavaScript; every form is a plain HTML form.
(function () {
  "use strict";
  var form = document.querySelector("form.filters");
  if (!form) { return; }
  var label = document.createElement("label");
  var box = document.createElement("input");
  box.type = "checkbox";
  box.id = "autorefresh";
  box.checked = sessionStorage.getItem("effects-autorefresh") === "1";
  label.appendChild(box);
  label.appendChild(document.createTextNode(" refresh every 15 s"));
  form.appendChild(label);
  var timer = null;
  function arm() {
    if (timer) { clearTimeout(timer); timer = null; }
    sessionStorage.setItem("effects-autorefresh", box.checked ? "1" : "0");
    if (box.checked) { timer = setTimeout(function () { location.reload(); }, 15000); }
  }
  box.addEventListener("change", arm);
  arm();
})();
