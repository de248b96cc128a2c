/* nndx pages: draw the figures whose specs the page carries in
   <script type="application/json"> blocks, and take a finding's link to its plot and step.
   Loaded from this service (CSP script-src 'self'); no inline script, no eval. */
(function () {
  "use strict";

  var CONFIG = {
    displaylogo: false,
    responsive: true,
    modeBarButtonsToRemove: ["select2d", "lasso2d"],
    toImageButtonOptions: { format: "png", scale: 2 }
  };

  function draw(el) {
    if (!el || el.getAttribute("data-drawn")) {
      return Promise.resolve(el);
    }
    el.setAttribute("data-drawn", "1");
    var source = document.getElementById(el.getAttribute("data-spec"));
    var spec = JSON.parse(source.textContent);
    return Plotly.newPlot(el, spec.data, spec.layout, CONFIG).then(function () {
      el.setAttribute("data-ready", "1");
      return el;
    });
  }

  function highlight(el, step) {
    var layout = el.layout || {};
    var shapes = (layout.shapes || []).filter(function (s) { return s.name !== "nndx-focus"; });
    shapes.push({
      name: "nndx-focus", type: "line", xref: "x", yref: "paper", x0: step, x1: step, y0: 0, y1: 1,
      line: { color: "#d62728", width: 2 }
    });
    return Plotly.relayout(el, { shapes: shapes });
  }

  var plots = Array.prototype.slice.call(document.querySelectorAll(".plot-area[data-spec]"));
  if ("IntersectionObserver" in window) {
    var observer = new IntersectionObserver(function (entries) {
      entries.forEach(function (entry) {
        if (entry.isIntersecting) {
          observer.unobserve(entry.target);
          draw(entry.target);
        }
      });
    }, { rootMargin: "600px 0px" });
    plots.forEach(function (el) { observer.observe(el); });
  } else {
    plots.forEach(draw);
  }

  document.addEventListener("click", function (event) {
    var link = event.target.closest ? event.target.closest("a.goto[data-figure]") : null;
    if (!link) {
      return;
    }
    var el = document.getElementById("plot-" + link.getAttribute("data-figure"));
    var step = link.getAttribute("data-step");
    if (!el) {
      return;
    }
    draw(el).then(function () {
      if (step !== null && el.getAttribute("data-steps")) {
        return highlight(el, Number(step));
      }
    });
  });
})();
