// The console's little script: the pending page's refresh toggle and the resolve buttons.
"use strict";

(function liveRefresh() {
  const box = document.getElementById("live");
  if (!box) return;
  box.checked = localStorage.getItem("txstream-live") === "1";
  box.addEventListener("change", () => {
    localStorage.setItem("txstream-live", box.checked ? "1" : "0");
    if (box.checked) location.reload();
  });
  setInterval(() => { if (box.checked) location.reload(); }, 5000);
})();

(function resolveButtons() {
  const form = document.getElementById("admin");
  if (!form) return;
  const token = document.getElementById("admin-token");
  const operator = document.getElementById("admin-operator");
  const reason = document.getElementById("admin-reason");
  const result = document.getElementById("admin-result");
  token.value = sessionStorage.getItem("txstream-admin-token") || "";
  operator.value = localStorage.getItem("txstream-operator") || "";

  async function waitForVerdict(before) {
    // The coordinator applies the decision in its next micro-batch; the index sees it then.
    for (let i = 0; i < 120; i++) {
      await new Promise((r) => setTimeout(r, 1000));
      const answer = await fetch(form.dataset.poll);
      if (!answer.ok) continue;
      const tx = (await answer.json()).transaction;
      if (tx && tx.status !== before) { location.reload(); return; }
    }
    result.textContent += " The coordinator has not recorded it yet: reload later.";
  }

  async function resolve(decision) {
    sessionStorage.setItem("txstream-admin-token", token.value);
    localStorage.setItem("txstream-operator", operator.value);
    result.textContent = "sending " + decision + "...";
    const answer = await fetch(form.dataset.url, {
      method: "POST",
      headers: { "Content-Type": "application/json", "Authorization": "Bearer " + token.value },
      body: JSON.stringify({ decision, operator: operator.value, reason: reason.value }),
    });
    const body = await answer.json().catch(() => ({}));
    if (answer.status === 202) {
      result.textContent = body.decision + " by " + body.operator + " written to " +
        body.written + "; waiting for the coordinator...";
      waitForVerdict(document.getElementById("tx-status").textContent.trim());
    } else {
      if (answer.status === 403) sessionStorage.removeItem("txstream-admin-token");
      result.textContent = "refused (" + answer.status + "): " + (body.error || answer.statusText);
    }
  }

  for (const button of form.querySelectorAll("button[data-decision]")) {
    button.addEventListener("click", () => resolve(button.dataset.decision));
  }
})();
