// The queue refreshes itself: ask for the rows while the snapshot's version is unchanged
// the server answers 204, so polling costs a stat of one file.
(function () {
  "use strict";

  function poll(live) {
    const every = parseInt(live.dataset.pollMs, 10) || 1500;
    let version = live.dataset.version || "";
    let busy = false;
    const tick = async function () {
      if (busy || document.hidden) return;
      busy = true;
      try {
        const params = new URLSearchParams(live.dataset.query || "");
        params.set("page", live.dataset.page || "1");
        params.set("v", version);
        const response = await fetch((live.dataset.rowsUrl || "/queue/rows") + "?" + params.toString(), {
          credentials: "same-origin",
          headers: { "Accept": "text/html" },
        });
        if (response.status === 200) {
          live.innerHTML = await response.text();
          version = response.headers.get("x-inbox-version") || version;
          live.dataset.version = version;
          const total = document.getElementById("total");
          if (total) document.title = "(" + total.textContent + ") stepledger inbox";
        }
      } catch (err) {
        // The inbox is restarting or the network dropped: try again on the next tick.
      } finally {
        busy = false;
      }
    };
    window.setInterval(tick, every);
  }

  function resultField(form) {
    const result = form.querySelector("#result-label");
    if (!result) return;
    const sync = function () {
      const chosen = form.querySelector("input[name=answer]:checked");
      result.hidden = !(chosen && chosen.value === "happened");
    };
    form.addEventListener("change", sync);
    sync();
  }

  document.addEventListener("DOMContentLoaded", function () {
    const live = document.getElementById("live");
    if (live) poll(live);
    const form = document.getElementById("answer-form");
    if (form) resultField(form);
  });
})();
