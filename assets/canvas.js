// flash-dllm-chat: player of an exported denoising (see app/export.py for the data layout).
(function () {
  const data = JSON.parse(document.getElementById("fd-data").textContent);
  const canvas = document.getElementById("fd-canvas");
  const head = document.getElementById("fd-head");
  const cells = document.getElementById("fd-cells");
  const slider = document.getElementById("fd-step");
  const label = document.getElementById("fd-label");
  const play = document.getElementById("fd-play");
  const last = data.deltas.length;
  let shown = -1;
  let current = data.initial.slice();
  let timer = null;

  function show(step) {
    step = Math.max(0, Math.min(last, step | 0));
    if (step < shown || shown < 0) { current = data.initial.slice(); shown = 0; }
    for (let i = shown; i < step; i++) {
      for (const [cell, fragment] of data.deltas[i]) current[cell] = fragment;
    }
    shown = step;
    canvas.style.setProperty("--n", data.n[step]);
    head.innerHTML = data.heads[step];
    cells.innerHTML = data.prompt + current.map((i) => data.fragments[i]).join("");
    slider.value = step;
    label.textContent = "step " + step + " / " + last;
  }

  slider.addEventListener("input", () => show(+slider.value));
  play.addEventListener("click", () => {
    if (timer) { clearInterval(timer); timer = null; play.textContent = "▶ play"; return; }
    let step = +slider.value >= last ? 0 : +slider.value;
    play.textContent = "❚❚ pause";
    timer = setInterval(() => {
      show(step++);
      if (step > last) { clearInterval(timer); timer = null; play.textContent = "▶ play"; }
    }, Math.max(15, Math.min(120, 6000 / Math.max(1, last))));
  });
  show(last);
})();
