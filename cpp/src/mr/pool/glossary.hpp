// The caching pool's words, each as the code uses it. docs/pool-design.md
// draws how a request flows through the parts; this header names things.
//
// Memory
//   arena        A contiguous address range the pool places blocks in. A paged
//                pool has two, each a large virtual reservation backed page by
//                page: [0] small (requests <= small_threshold), [1] large. A
//                pool over a non-paged upstream has one arena per segment.
//   segment      (Non-paged upstreams) one allocation taken from the upstream,
//                carved into blocks; given back whole once wholly free.
//   page         The pool's unit of physical memory (page_size, a multiple of
//                the device granularity). A page handle names one physical
//                page; `handles[p]` is the page in use at page p of an arena.
//   top          One past the highest page of an arena ever mapped: nothing is
//                mapped or in use above it.
//   block        A piece of an arena: live (handed out), free (in a slot's
//                index) or pending. Blocks tile their arena in address order.
//   pending      A block freed while streams other than its own (freed on
//                another stream, record_stream) may still use it; it waits
//                for their events before it becomes free.
//   interior     The pages lying wholly inside a block. Pages at its edges it
//     pages      may share with its neighbours.
//
// Free blocks
//   slot         The free blocks of one stream (a stream slot). Slot 0 is
//                shared: its blocks' work is known complete, any stream may
//                take them. A block freed on its own stream goes to that
//                stream's slot; adjacent free blocks of one slot are merged.
//   backed       A free block all of whose interior pages are mapped: it can be
//                handed out without mapping anything.
//   hollow       A free block with unmapped interior pages (`unmapped` counts
//                them): handing it out means mapping pages first.
//   bin          A size class of the free index (free_index.hpp): a fit is two
//                bitmap scans; an exhaustive fit looks at every block of the
//                request's own bin.
//   stealable    A free block with at least one mapped interior page; it is on
//                its slot's steal list (oldest first).
//   steal        Taking mapped interior pages out of a free block (one run,
//                from its high end) so they can back another block: the free
//                block becomes (more) hollow. Also "remap": pages_remapped.
//   reclaim      Handing one stream's free blocks to slot 0 once an event
//                recorded on that stream after they were freed has completed.
//   progress     An event recorded at a free on a stream (one in flight per
//     event      slot, at most one per 32 frees, asked at most every 8th
//                free): once done, the slot's blocks freed before it
//                (seq <= done_seq) may be reclaimed for page supply although
//                the event recorded when pages are needed is not done yet.
//   seq          When a free block was freed (free_seq counts frees): a slot's
//                reclaim event covers the blocks with seq <= its event_seq.
//   run          Free blocks next to each other that one requester may take
//                together (its own slot's and slot 0's): placement may carve
//                a block out of a run across several of them.
//   carve        Cutting a place found across a run into one free block of the
//                requester (uncarve: putting the run back when backing fails).
//
// Pages and mappings
//   spare        A created page in use nowhere (after a failed or partial
//                placement, or a steal not yet used). Spares are used first.
//   kept mapping With keep_mappings, a stolen page stays mapped at its old
//                address (`phys[p]` != 0 while `handles[p]` == 0): if it comes
//                back there (return home) no map call is needed.
//   stale        Such a kept mapping: mapped at an address where the page is
//                not in use. `stale` counts them; a page is destroyed only once
//                no stale mapping of it is left.
//   taken early  (remap_own) A page stolen from the requester's own slot
//                before its old block's work is known done: its kept mapping
//                there carries an early mark (`arena::early`), whose event,
//                recorded on that stream when it was taken, must complete
//                before that address is unmapped or mapped over, or before
//                the page may reach another stream (a spare, an edge page).
//   return home  Reordering the pages supplied for a block so each goes back to
//                an address that still maps it (a reused mapping, no call).
//   made ahead   (map_ahead) A page the helper thread created and mapped just
//                past the large arena's highest page in use before any block
//                needed it
//                (ahead bit, `phys[p]` set, `handles[p]` 0). A block placed
//                over it takes it as it is; a block elsewhere may take it when
//                no page may be created. `inflight` is the batch being made.
//   chunk        (chunk_size) One physical handle over `chunk` pages of the
//                large arena, at a multiple of `chunk`, mapped whole (the
//                driver maps a handle only from its start and only all of it).
//                Made where a block's interior grows over whole chunk places
//                (growth_chunks: also at its ends, reaching into free neighbours);
//                never moved or stolen page by page: when memory must move, a
//                chunk lying wholly inside a free block is given back instead
//                (its room lets single pages be made), and trim gives chunks
//                back the same way. `chunk_bits` marks its pages. With
//                plan_steps, made only until the second mark, where the free
//                ones go back and the others are split (split_chunks): new
//                single pages take the chunk's bytes and its place.
//                chunk_min_size: where a whole chunk does not fit, chunks of
//                chunk/2, chunk/4, ... down to `chunk_min` pages, each at a
//                multiple of its own size (so inside one chunk place); a
//                chunk's extent is the run of chunk pages under one handle
//                (chunk_span).
//   step plan    (plan_steps) One recorded step's large requests laid out at
//                fixed offsets (largest first, lowest free offset over each
//                block's lifetime, the step a circle) in the address space
//                past every live or pending block of the large arena. A later request, the
//                n-th of its size in its step, goes to the n-th recorded one's
//                place (`plan_place`) when every block there is free and its
//                to take; else it is a miss, placed as usual.
//   mark         mark_step(): a step of the program begins; the phases warming,
//                recording, following and planned move on at each mark.
//
// Growth and release
//   need live    The live bytes once the block being placed is handed out;
//                growth is measured against it and against the peak live.
//   growth slack Without waiting for a stream, the pool creates a new page only
//                while reserved stays within (1 + growth_slack) x peak live;
//                past it, it steals first.
//   reserve      The most physical memory the pool may hold (reserve_limit, or
//     limit      the device capacity); set_reserve_limit trims down to it.
//   trim         Giving cached pages back until cached <= a target: spares
//                first, then pages made ahead, then pages stolen from shared
//                free blocks.
//   release      release_cached: wait for every stream, then trim to 0.
//     cached
//   OOM path     When nothing fits: reclaim streams, wait for pending frees and
//                for every stream, destroy the spares and pages made ahead (or free
//                whole segments), try once more, else throw out_of_memory.
#pragma once
