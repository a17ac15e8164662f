// The draft-tree view's front end (lab/viz/inspector.py, TreeView). Python draws the SVG or a phase
// (lab/viz/drawing.py, lab/viz/phases.py); this shows it and reports clicks on nodes and, while the
// view has focus, the arrow keys (step forward and back) and T (the whole tree or the phase) back to
// Python. Escape gives the focus back to the notebook. The notebook's own shortcuts are suppressed
// only inside the view. Two buttons save the view on show as SVG or PNG (a phase's HTML inside an
// SVG foreignObject). Bundled with the package: nothing is fetched at run time.
const KEYS = ["ArrowRight", "ArrowLeft", "t", "T"];

function asSvg(content) {
  const svg = content.querySelector("svg");
  if (svg) {
    return { markup: svg.outerHTML, width: svg.width.baseVal.value, height: svg.height.baseVal.value };
  }
  const width = Math.ceil(content.scrollWidth), height = Math.ceil(content.scrollHeight);
  const xhtml = new XMLSerializer().serializeToString(content.firstElementChild);
  return { markup: `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}">`
    + `<foreignObject width="100%" height="100%">${xhtml}</foreignObject></svg>`, width, height };
}

function save(href, name) {
  const link = document.createElement("a");
  link.href = href;
  link.download = name;
  link.click();
}

function render({ model, el }) {
  const bar = document.createElement("div");
  const content = document.createElement("div");
  bar.className = "lab-export";
  bar.innerHTML = '<button class="lab-save-svg" aria-label="save this view as SVG">⤓ SVG</button> '
    + '<button class="lab-save-png" aria-label="save this view as PNG">⤓ PNG</button>';
  const draw = () => {
    content.innerHTML = model.get("svg");
  };
  const saveSvg = () => {
    const { markup } = asSvg(content);
    save(URL.createObjectURL(new Blob([markup], { type: "image/svg+xml" })), "inspector_view.svg");
  };
  const savePng = () => {
    const { markup, width, height } = asSvg(content);
    const image = new Image();
    image.onload = () => {
      const canvas = document.createElement("canvas");
      canvas.width = width;
      canvas.height = height;
      const context = canvas.getContext("2d");
      context.fillStyle = "#ffffff";
      context.fillRect(0, 0, width, height);
      context.drawImage(image, 0, 0);
      canvas.toBlob((blob) => save(URL.createObjectURL(blob), "inspector_view.png"), "image/png");
    };
    image.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(markup);
  };
  const click = (event) => {
    el.focus();
    if (event.target.closest(".lab-save-svg")) {
      saveSvg();
    } else if (event.target.closest(".lab-save-png")) {
      savePng();
    } else {
      const node = event.target.closest("[data-node]");
      if (node) {
        model.send({ click: Number(node.dataset.node) });
      }
    }
  };
  const key = (event) => {
    if (KEYS.includes(event.key)) {
      model.send({ key: event.key.length === 1 ? event.key.toLowerCase() : event.key });
    } else if (event.key === "Escape") {
      el.blur();
    } else {
      return;
    }
    event.preventDefault();
    event.stopPropagation();
  };
  el.classList.add("lab-draft-tree");
  el.style.overflowX = "auto";
  el.tabIndex = 0;
  el.setAttribute("role", "region");
  el.setAttribute("aria-label", "decoding cycle: arrow keys step through the phases, T shows the whole tree, "
    + "Escape returns to the notebook");
  el.dataset.lmSuppressShortcuts = "true";  // JupyterLab's and Notebook 7's keys stay out of the view
  el.append(bar, content);
  el.addEventListener("click", click);
  el.addEventListener("keydown", key);
  model.on("change:svg", draw);
  draw();
  return () => {
    model.off("change:svg", draw);
    el.removeEventListener("click", click);
    el.removeEventListener("keydown", key);
  };
}

export default { render };
