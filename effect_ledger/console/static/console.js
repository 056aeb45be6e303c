// effect-ledger console: optional auto-refresh of the read-only pages and copy buttons beside
// effect ids. The pages work without JavaScript (every form is a plain HTML form; a full id is in
// its link's title and selectable on the effect's page).
(function () {
  "use strict";
  if (!navigator.clipboard) { return; }
  var ids = document.querySelectorAll("[data-copy]");
  for (var i = 0; i < ids.length; i++) {
    (function (el) {
      var b = document.createElement("button");
      b.type = "button";
      b.className = "copy";
      b.title = "copy the full id";
      b.textContent = "copy";
      b.addEventListener("click", function () {
        navigator.clipboard.writeText(el.getAttribute("data-copy")).then(function () { b.textContent = "copied"; });
      });
      el.insertAdjacentElement("afterend", b);
    })(ids[i]);
  }
})();
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
