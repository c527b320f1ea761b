//! The caching allocator's segments at the step's peak: every segment PyTorch holds, in
//! address order, laid end to end and folded into rows; allocated blocks filled, cached free
//! ones pale. Beside it, what `expandable_segments:True` would reserve for the same run.
//! Drawn when the book is built, for the page's scenario (the preprocessor inserts it
//! without a host element: the browser keeps it as drawn).

use gpumem::alloc::Segment;
use yew::prelude::*;

use crate::allocator::{use_knobs, use_live_marker};
use crate::chart::{n, refused, use_width};
use crate::format::{count, gib, tokens};
use crate::Init;

const ROWS: f64 = 6.0;
const ROW_H: f64 = 18.0;
const GAP: f64 = 6.0;

/// The rectangles of `segments` folded into `ROWS` rows of `w` pixels: (x, y, width,
/// allocated, segment start). Blocks thinner than a pixel are drawn a pixel wide.
pub fn layout(segments: &[Segment], w: f64) -> Vec<(f64, f64, f64, bool, bool)> {
    let total: u64 = segments.iter().map(|s| s.bytes()).sum();
    if total == 0 || w <= 0.0 {
        return Vec::new();
    }
    let per_px = total as f64 / (w * ROWS);
    let mut out = Vec::new();
    let mut at = 0.0f64;
    for s in segments {
        let mut first = true;
        for &(bytes, allocated) in &s.blocks {
            let mut len = bytes as f64 / per_px;
            while len > 0.0 {
                let row = (at / w).floor().min(ROWS - 1.0);
                let x = at - row * w;
                let piece = len.min(w - x).max(0.0);
                if piece <= 0.0 {
                    at = (row + 1.0) * w;
                    continue;
                }
                out.push((x, row * (ROW_H + GAP), piece.max(1.0), allocated, first));
                first = false;
                at += piece;
                len -= piece;
                if row >= ROWS - 1.0 && x + piece >= w {
                    break;
                }
            }
        }
    }
    out
}

#[component]
pub fn Segments(init: &Init) -> Html {
    let (k, _) = use_knobs(init, false);
    let root = use_live_marker();
    let (svg_ref, w) = use_width();
    let (title_id, summary_id) = (init.id("title"), init.id("summary"));
    // Natively, with the allocator replayed (`Knobs::estimate` does not replay it).
    let replayed = |k: &crate::Knobs| k.scenario().and_then(|s| gpumem::estimate(&s));
    let e = match replayed(&k) {
        Ok(e) => e,
        Err(err) => return refused("segments", root, err),
    };
    // A dark edge starts each segment.
    let segs = k
        .scenario()
        .ok()
        .and_then(|s| gpumem::alloc::stream::segments_at_peak(&s))
        .unwrap_or_default();
    if !e.reserved_replayed || segs.is_empty() {
        return html! {
            <figure class="gm gm-segments" data-widget="segments" ref={root}>
                <p class="gm-note">{ "The caching allocator is replayed for training on one GPU; this scenario is not one." }</p>
            </figure>
        };
    }
    let other = k.with(
        "allocator",
        if e.allocator.starts_with("expandable") {
            "default"
        } else {
            "expandable"
        },
    );
    let alt = replayed(&other).ok();
    let rects = layout(&segs, w);
    let h = ROWS * (ROW_H + GAP) - GAP;
    let large = segs.iter().filter(|s| !s.small).count();
    let held: u64 = segs.iter().map(|s| s.bytes()).sum();
    let used: u64 = segs.iter().map(|s| s.allocated()).sum();
    let largest = segs
        .iter()
        .flat_map(|s| s.blocks.iter().filter(|b| !b.1).map(|b| b.0))
        .max()
        .unwrap_or(0);
    let summary = format!(
        "At the peak of the step the caching allocator holds {} in {} segments ({} of them for small tensors): {} allocated, {} cached but free; the largest free block is {}.",
        gib(held as f64),
        count(segs.len() as u64),
        count((segs.len() - large) as u64),
        gib(used as f64),
        gib(held.saturating_sub(used) as f64),
        gib(largest as f64),
    );
    let compare = alt.map(|a| {
        format!(
            "With {} the same run would reserve {} at its high ({} now).",
            if a.allocator.starts_with("expandable") {
                "expandable_segments:True"
            } else {
                "the default allocator"
            },
            gib(a.peak_reserved_bytes as f64),
            gib(e.peak_reserved_bytes as f64)
        )
    });
    html! {
        <figure class="gm gm-segments" data-widget="segments" ref={root} aria-labelledby={title_id.clone()}
            aria-describedby={summary_id.clone()}>
            <figcaption class="gm-head" id={title_id}>
                <span class="gm-title">{ "The allocator's segments at the peak" }</span>
                <span class="gm-sub">{ format!("{} · b={} · s={} · {} allocator", e.model, k.count("batch", 1), tokens(k.count("seq", 2048)), e.allocator) }</span>
            </figcaption>
            <svg class="gm-chart" ref={svg_ref} viewBox={format!("0 0 {} {}", n(w), n(h))} role="img" aria-labelledby={summary_id.clone()}>
                { for rects.iter().map(|&(x, y, rw, allocated, start)| html! {
                    <rect class={classes!(if allocated { "gm-blk-a" } else { "gm-blk-f" }, start.then_some("gm-blk-start"))}
                        x={n(x)} y={n(y)} width={n(rw)} height={n(ROW_H)} />
                }) }
            </svg>
            <ul class="gm-legend">
                <li><span class="gm-swatch gm-blk-a-sw" aria-hidden="true"></span><span class="gm-name">{ "allocated" }</span><span class="gm-num">{ gib(used as f64) }</span></li>
                <li><span class="gm-swatch gm-blk-f-sw" aria-hidden="true"></span><span class="gm-name">{ "cached, free (drawn pale)" }</span><span class="gm-num">{ gib(held.saturating_sub(used) as f64) }</span></li>
            </ul>
            <p class="gm-note">{ summary.clone() }</p>
            if let Some(c) = compare {
                <p class="gm-note">{ c }</p>
            }
            <p class="gm-note">{ "Drawn for this page's scenario as the book was built." }</p>
            <p class="gm-sr" id={summary_id}>{ summary }</p>
        </figure>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_folded_bar_covers_every_byte_in_its_rows() {
        let segs = vec![
            Segment {
                small: false,
                blocks: vec![(30 << 20, true), (10 << 20, false)],
            },
            Segment {
                small: true,
                blocks: vec![(2 << 20, false)],
            },
            Segment {
                small: false,
                blocks: vec![(80 << 20, true)],
            },
        ];
        let w = 300.0;
        let r = layout(&segs, w);
        let drawn: f64 = r.iter().map(|x| x.2).sum();
        assert!((drawn - w * ROWS).abs() < 4.0, "{drawn}");
        assert!(r.iter().all(|x| x.0 >= 0.0 && x.0 + x.2 <= w + 1.0));
        assert_eq!(r.iter().filter(|x| x.4).count(), 3);
        assert!(r.iter().all(|x| x.1 < ROWS * (ROW_H + GAP)));
    }
}
