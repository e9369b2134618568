//! The page's JavaScript half (`web/js/views.js`, bundled into `views.js`
//! as the global `kilnViews`): CodeMirror, the layout worker (dagre), pan
//! and zoom.

use wasm_bindgen::prelude::*;

#[wasm_bindgen]
extern "C" {
    /// A CodeMirror editor.
    pub type Editor;

    /// A CodeMirror editor in `parent` holding `doc`; `on_change` gets the
    /// text after typing, `on_run` is called on Ctrl+Enter.
    #[wasm_bindgen(js_namespace = kilnViews, js_name = createEditor)]
    pub fn create_editor(
        parent: &web_sys::HtmlElement,
        doc: &str,
        on_change: &Closure<dyn Fn(String)>,
        on_run: &Closure<dyn Fn()>,
    ) -> Editor;

    /// Replaces the text (not counted as typing).
    #[wasm_bindgen(method, js_name = setText)]
    pub fn set_text(this: &Editor, text: &str);

    /// Marks an error at a 1-based line and column with its message.
    #[wasm_bindgen(method, js_name = markError)]
    pub fn mark_error(this: &Editor, line: u32, column: u32, message: &str);

    /// Removes the error mark.
    #[wasm_bindgen(method, js_name = clearError)]
    pub fn clear_error(this: &Editor);

    /// Selects a 1-based line and scrolls to it.
    #[wasm_bindgen(method, js_name = revealLine)]
    pub fn reveal_line(this: &Editor, line: u32);

    /// A read-only CodeMirror view of WGSL source.
    pub type CodeView;

    /// A code view in `parent`, empty.
    #[wasm_bindgen(js_namespace = kilnViews, js_name = createCodeView)]
    pub fn create_code_view(parent: &web_sys::HtmlElement) -> CodeView;

    /// Shows `text` in the code view.
    #[wasm_bindgen(method, js_name = setText)]
    pub fn set_code(this: &CodeView, text: &str);

    /// Lays a graph out with dagre in the layout worker: a promise of the
    /// placed graph (see `layoutGraph` in layout.js).
    #[wasm_bindgen(js_namespace = kilnViews, js_name = layoutGraph)]
    pub fn layout_graph(input: &JsValue) -> js_sys::Promise;

    /// Centres a point of the drawing in the view.
    #[wasm_bindgen(js_namespace = kilnViews, js_name = focusGraph)]
    pub fn focus_graph(svg: &web_sys::Element, x: f64, y: f64);

    /// Fits the whole drawing in the view.
    #[wasm_bindgen(js_namespace = kilnViews, js_name = fitGraph)]
    pub fn fit_graph(svg: &web_sys::Element, width: f64, height: f64);

    /// Shows a new drawing fitted in the view, but at a zoom where its
    /// text is readable (its top, centred, when it is larger).
    #[wasm_bindgen(js_namespace = kilnViews, js_name = showGraph)]
    pub fn show_graph(svg: &web_sys::Element, width: f64, height: f64);

    /// The `data-box` index of the box an event happened on, or -1.
    #[wasm_bindgen(js_namespace = kilnViews, js_name = boxAt)]
    pub fn box_at(event: &web_sys::Event) -> i32;

    /// Gives a class to exactly the elements matching a selector.
    #[wasm_bindgen(js_namespace = kilnViews, js_name = markOnly)]
    pub fn mark_only(root: &web_sys::Element, class_name: &str, selector: &str);
}
