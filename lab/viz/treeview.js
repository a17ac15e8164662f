// The draft-tree view's front end (lab/viz/inspector.py, TreeView). Python draws the SVG
// (lab/viz/drawing.py); this shows it and reports clicks on nodes back to Python, which
// selects the node and folds or unfolds its branch. Bundled with the package: nothing is
// fetched at run time.
function render({ model, el }) {
  const draw = () => {
    el.innerHTML = model.get("svg");
  };
  const click = (event) => {
    const node = event.target.closest("[data-node]");
    if (node) {
      model.send({ click: Number(node.dataset.node) });
    }
  };
  el.classList.add("lab-draft-tree");
  el.style.overflowX = "auto";
  el.addEventListener("click", click);
  model.on("change:svg", draw);
  draw();
  return () => {
    model.off("change:svg", draw);
    el.removeEventListener("click", click);
  };
}

export default { render };
